"""Rotary position embedding settings read from a config.json, without torch.

Both spellings are read: `rope_theta` + `rope_scaling` (older) and `rope_parameters` (newer).
The scaling types are those of transformers' `ROPE_INIT_FUNCTIONS` that Baton implements:
default, linear, dynamic (NTK), yarn, llama3 and longrope (Phi-3's "su").
"""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.checkpoint.unsupported_model import UnsupportedModelError

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


@dataclass(slots=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    # linear, dynamic, yarn, llama3, longrope: how far the context is stretched.
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # The context length the model was pretrained at (llama3, dynamic, yarn, longrope).
    original_max_position_embeddings: int = 8192
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    # yarn and longrope: the factor cos and sin are multiplied by; None derives it from `factor`.
    attention_factor: float | None = None
    # longrope: per-frequency stretch within the original context, and past it.
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()


def rope_config(raw: dict, params: dict | None = None) -> RopeConfig:
    """The rope settings of config.json `raw`; `params` overrides where they are read from (a
    per-layer-type entry of Gemma 3's `rope_parameters`)."""
    if params is None:
        params = {**(raw.get("rope_scaling") or {}), **(raw.get("rope_parameters") or {})}
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    rope_type = {"su": "longrope", "mrope": "default"}.get(rope_type, rope_type)
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope scaling {rope_type!r} is not supported; Baton implements {', '.join(ROPE_TYPES)}"
        )
    if float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise UnsupportedModelError(
            "partial rotary embeddings (partial_rotary_factor < 1) are not supported natively"
        )
    rope = RopeConfig(theta=float(theta), rope_type=rope_type)
    original = params.get(
        "original_max_position_embeddings",
        raw.get("original_max_position_embeddings", raw.get("max_position_embeddings")),
    )
    if original is not None:
        rope.original_max_position_embeddings = int(original)
    if rope_type == "llama3":
        rope.original_max_position_embeddings = int(
            params.get("original_max_position_embeddings", 8192)
        )
        rope.low_freq_factor = float(params.get("low_freq_factor", 1.0))
        rope.high_freq_factor = float(params.get("high_freq_factor", 4.0))
    if params.get("factor") is not None:
        rope.factor = float(params["factor"])
    elif rope_type in ("yarn", "longrope") and raw.get("max_position_embeddings"):
        # transformers' rule when a yarn or longrope config leaves the factor out.
        rope.factor = raw["max_position_embeddings"] / rope.original_max_position_embeddings
    if rope_type == "yarn":
        rope.beta_fast = float(params.get("beta_fast") or 32.0)
        rope.beta_slow = float(params.get("beta_slow") or 1.0)
        rope.mscale = params.get("mscale")
        rope.mscale_all_dim = params.get("mscale_all_dim")
        rope.truncate = bool(params.get("truncate", True))
    if params.get("attention_factor") is not None:
        rope.attention_factor = float(params["attention_factor"])
    if rope_type == "longrope":
        rope.short_factor = tuple(float(f) for f in params["short_factor"])
        rope.long_factor = tuple(float(f) for f in params["long_factor"])
    return rope
