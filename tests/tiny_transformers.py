"""A tiny random checkpoint of a transformers config class, saved by transformers itself with the
tests' tokenizer, for the tests that run transformers' own modeling code."""

from __future__ import annotations

from pathlib import Path

import torch


def save_tiny_checkpoint(config_class: str, fields: dict, tokenizer, out: Path) -> Path:
    """`config_class(**fields)` with the tokenizer's special ids, random weights drawn from seed
    0, saved to `out` beside the tokenizer."""
    import transformers

    config = getattr(transformers, config_class)(
        **fields,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
