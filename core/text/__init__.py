"""Text in and out of the engine: the tokenizer and chat template, incremental detokenization, stop
conditions.
"""
