"""Offline tools that no server needs: the demo model's trainer, the tokenizer trainer, random-
weight test checkpoints.
"""
