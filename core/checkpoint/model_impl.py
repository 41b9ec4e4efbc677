"""Which model serves a checkpoint: Baton's native one where it implements the architecture,
else transformers' own modeling code over Baton's paged KV cache (the generic path).

`--model-impl` (EngineConfig.model_impl) forces one: `native` refuses what Baton does not
implement, `transformers` runs even a native family through transformers' code.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from baton.core.checkpoint.checkpoint_check import check_checkpoint
from baton.core.checkpoint.model_config import (
    ModelConfig,
    RopeConfig,
    UnsupportedModelError,
    _eos_token_ids,
)

logger = logging.getLogger(__name__)

# The spellings transformers' configs use for the sizes Baton needs, most common first.
ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "max_position_embeddings": (
        "max_position_embeddings",
        "n_positions",
        "max_sequence_length",
        "seq_length",
        "n_ctx",
    ),
}
# transformers' own default when a config names no context length.
DEFAULT_MAX_POSITIONS = 2048


def resolve_model_config(
    model: str | Path, model_impl: str = "auto", *, needs_weights: bool = True
) -> ModelConfig:
    """Check the checkpoint (baton.core.checkpoint.checkpoint_check), then read its config for the
    path it runs on.

    The generic path's KV shape is read from config.json here and confirmed by the loader, which
    sees the shapes the modeling code actually hands attention.
    """
    path = check_checkpoint(model, needs_weights=needs_weights)
    if model_impl != "transformers":
        try:
            config = ModelConfig.from_pretrained(path)
        except UnsupportedModelError as error:
            if model_impl == "native":
                raise
            logger.info("no native model for %s (%s): using the generic path", path, error)
        else:
            return config
    return generic_model_config(path)


def generic_model_config(path: Path) -> ModelConfig:
    """A `ModelConfig` for the generic path: what the engine and the KV cache need to know.

    The fields only Baton's native model reads (norm epsilon, rope, biases) keep neutral values.
    """
    raw = json.loads((path / "config.json").read_text())
    text = {**raw, **(raw.get("text_config") or {})}
    heads = _first(text, "num_attention_heads")
    hidden = _first(text, "hidden_size")
    kv_heads = text.get("num_key_value_heads") or text.get("num_kv_heads")
    if kv_heads is None:
        kv_heads = 1 if text.get("multi_query") else heads
    sliding_window = text.get("sliding_window")
    if text.get("use_sliding_window") is False:
        sliding_window = None
    architectures = raw.get("architectures") or [raw.get("model_type", "unknown")]
    config = ModelConfig(
        path=path,
        architecture=architectures[0],
        vocab_size=text["vocab_size"],
        hidden_size=hidden,
        intermediate_size=_first(text, "intermediate_size", 0) or 0,
        num_hidden_layers=_first(text, "num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=text.get("head_dim") or hidden // heads,
        max_position_embeddings=_first(text, "max_position_embeddings", DEFAULT_MAX_POSITIONS),
        rms_norm_eps=0.0,
        rope=RopeConfig(),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        qkv_bias=False,
        o_proj_bias=False,
        qk_norm=False,
        dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        sliding_window=sliding_window if isinstance(sliding_window, int) else None,
        bos_token_id=text.get("bos_token_id"),
        model_impl="transformers",
    )
    config.eos_token_ids = _eos_token_ids(text, path / "generation_config.json")
    return config


def _first(raw: dict, name: str, default: int | None = None) -> int:
    for alias in ALIASES[name]:
        if raw.get(alias) is not None:
            return raw[alias]
    if default is None:
        raise UnsupportedModelError(f"config.json names no {' or '.join(ALIASES[name])}")
    return default
