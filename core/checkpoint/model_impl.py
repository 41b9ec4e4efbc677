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

# The spellings transformers' configs use for the sizes Baton needs, most common first (MPT
# and DBRX say n_heads/d_model/n_layers/max_seq_len, XGLM attention_heads/num_layers).
ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": (
        "num_attention_heads",
        "n_head",
        "num_heads",
        "n_heads",
        "attention_heads",
    ),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "kv_n_heads"),
    "max_position_embeddings": (
        "max_position_embeddings",
        "n_positions",
        "max_sequence_length",
        "seq_length",
        "n_ctx",
        "max_seq_len",
        "context_length",
    ),
}
# Sub-configs whose sizes count as the model's own: the text model of a multimodal config and
# DBRX's attention settings.
NESTED_CONFIGS = ("attn_config", "text_config")
# The config.json model_type each native architecture's weights are laid out for; a checkpoint
# naming the architecture with another model_type (EXAONE saves "LlamaForCausalLM" with its own
# tensor names) runs on the generic path, whose loader reads it as transformers does.
NATIVE_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
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
            _check_native_layout(path)
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
    Sizes config.json does not spell in a known way stay 0 here: the loader reads them from
    transformers' own config object and the shapes its code hands attention, and refuses a
    model for its true reason (a Mamba config names no attention heads because it has none).
    """
    raw = json.loads((path / "config.json").read_text())
    text = dict(raw)
    for nested in NESTED_CONFIGS:
        text.update(raw.get(nested) or {})
    heads = _first(text, "num_attention_heads", 0)
    hidden = _first(text, "hidden_size", 0)
    kv_heads = _first(text, "num_key_value_heads", 0) or None
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
        num_hidden_layers=_first(text, "num_hidden_layers", 0),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=text.get("head_dim") or (hidden // heads if heads else 0),
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


def _check_native_layout(path: Path) -> None:
    raw = json.loads((path / "config.json").read_text())
    architectures = raw.get("architectures") or []
    expected = NATIVE_MODEL_TYPES.get(architectures[0]) if architectures else None
    model_type = raw.get("model_type")
    if expected is not None and model_type is not None and model_type != expected:
        raise UnsupportedModelError(
            f"{path} names {architectures[0]} with model_type {model_type!r}, whose weights "
            f"transformers lays out as its own; the native model reads {expected!r} checkpoints"
        )


def _first(raw: dict, name: str, default: int) -> int:
    for alias in ALIASES[name]:
        if isinstance(raw.get(alias), int):
            return raw[alias]
    return default
