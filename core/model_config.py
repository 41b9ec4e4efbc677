"""A Hugging Face checkpoint's `config.json` and `generation_config.json`, read without torch.

Both the older and newer spellings are accepted: `rope_theta`/`rope_scaling` beside
`rope_parameters`, `torch_dtype` beside `dtype`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# Architectures the executor implements, and what distinguishes them. `attention_bias` means the
# config's flag of that name biases q/k/v/o (as transformers reads it); Qwen2 always biases q/k/v
# and never o; Mistral has no biases.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": {"attention_bias": True, "qkv_bias": False, "qk_norm": False},
    "MistralForCausalLM": {"attention_bias": False, "qkv_bias": False, "qk_norm": False},
    "Qwen2ForCausalLM": {"attention_bias": False, "qkv_bias": True, "qk_norm": False},
    "Qwen3ForCausalLM": {"attention_bias": True, "qkv_bias": False, "qk_norm": True},
}


class UnsupportedModelError(ValueError):
    pass


@dataclass(slots=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    # llama3 scaling
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(slots=True)
class ModelConfig:
    path: Path
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool
    o_proj_bias: bool
    qk_norm: bool
    dtype: str
    sliding_window: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    # Which model runs it: "native" (gpu.model) or "transformers" (gpu.transformers_model).
    model_impl: str = "native"

    @property
    def max_model_len(self) -> int:
        """The longest sequence served exactly: a sliding window caps it."""
        if self.sliding_window is not None:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(
                f"no config.json in {path}: --model must be a Hugging Face checkpoint folder"
            )
        raw = json.loads(config_file.read_text())
        architectures = raw.get("architectures") or []
        architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
        if architecture is None:
            raise UnsupportedModelError(
                f"{path} holds a {architectures or raw.get('model_type')} model; Baton supports "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        traits = SUPPORTED_ARCHITECTURES[architecture]
        attention_bias = traits["attention_bias"] and bool(raw.get("attention_bias", False))
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        sliding_window = raw.get("sliding_window")
        if not raw.get("use_sliding_window", architecture == "MistralForCausalLM"):
            sliding_window = None
        config = cls(
            path=path,
            architecture=architecture,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=_rope_config(raw),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            qkv_bias=traits["qkv_bias"] or attention_bias,
            o_proj_bias=attention_bias,
            qk_norm=traits["qk_norm"],
            dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
            sliding_window=sliding_window,
            bos_token_id=raw.get("bos_token_id"),
        )
        config.eos_token_ids = _eos_token_ids(raw, path / "generation_config.json")
        return config


def _rope_config(raw: dict) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise UnsupportedModelError(
            f"rope scaling {rope_type!r} is not supported; Baton implements default and llama3"
        )
    rope = RopeConfig(theta=float(theta), rope_type=rope_type)
    if rope_type == "llama3":
        rope.factor = float(params["factor"])
        rope.low_freq_factor = float(params.get("low_freq_factor", 1.0))
        rope.high_freq_factor = float(params.get("high_freq_factor", 4.0))
        rope.original_max_position_embeddings = int(
            params.get("original_max_position_embeddings", 8192)
        )
    return rope


def _eos_token_ids(raw: dict, generation_config: Path) -> list[int]:
    ids: list[int] = []
    sources = [raw.get("eos_token_id")]
    if generation_config.is_file():
        sources.append(json.loads(generation_config.read_text()).get("eos_token_id"))
    for value in sources:
        for token_id in value if isinstance(value, list) else [value]:
            if isinstance(token_id, int) and token_id not in ids:
                ids.append(token_id)
    return ids
