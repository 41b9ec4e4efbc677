"""The quoting workload of `speculative.py`: a bench-shaped Llama whose greedy decoding settles
into loops, and prompts that hold the model's own continuation, so each answer quotes its prompt.

The bench Llama's random weights never quote: its greedy text does not repeat, and a prompt that
holds its own earlier answer changes the next answer entirely, so a lookup's drafts are never
accepted there. The same shape drawn with smaller weights (`LOOP_INITIALIZER_RANGE`) reads the
same bytes per token and its greedy decoding falls into loops: a prompt of a seed text and the
first `quote_len` tokens of its greedy continuation is answered by the rest of that
continuation, which repeats what the prompt holds. How often a lookup's drafts are then
accepted is measured, not set, and reported beside every figure.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from llama_cpp_peer import peers_dir

# The bench preset's weights' spread is 0.1; at 0.03 greedy decoding loops within a few dozen
# tokens while the loops still differ from prompt to prompt.
LOOP_INITIALIZER_RANGE = 0.03
CHECKPOINT_NAME = "llama-bench-loops"


def loop_checkpoint() -> Path:
    """The bench-shaped Llama drawn with `LOOP_INITIALIZER_RANGE`, written once into the cache."""
    from baton.tools.random_checkpoint import write_checkpoint

    path = peers_dir() / "models" / CHECKPOINT_NAME
    if not (path / "config.json").is_file():
        partial = path.with_name(path.name + ".partial")
        write_checkpoint(partial, "llama", "bench", initializer_range=LOOP_INITIALIZER_RANGE)
        partial.rename(path)
    return path


def quoting_prompts(
    checkpoint: Path, count: int, seed_words: int, quote_len: int, seed: int = 0
) -> list[list[int]]:
    """`count` prompts as token ids: `seed_words` words drawn from the tokenizer's vocabulary,
    then the first `quote_len` tokens of the model's greedy continuation of them (transformers'
    `generate`, one thread, so the prompts are the same on every machine). Cached beside the
    checkpoint."""
    cache = checkpoint / f"quoting-prompts-{count}-{seed_words}-{quote_len}-{seed}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    torch.set_num_threads(1)
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 3)
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        seed_ids = tokenizer(" ".join(rng.choice(words) for _ in range(seed_words))).input_ids
        with torch.no_grad():
            out = model.generate(
                torch.tensor([seed_ids]),
                max_new_tokens=quote_len,
                min_new_tokens=quote_len,
                do_sample=False,
            )
        prompts.append(out[0].tolist())
    cache.write_text(json.dumps(prompts))
    return prompts
