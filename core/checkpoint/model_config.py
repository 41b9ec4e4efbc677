"""A Hugging Face checkpoint's `config.json` and `generation_config.json`, read without torch.

Both the older and newer spellings are accepted: `rope_theta`/`rope_scaling` beside
`rope_parameters`, `torch_dtype` beside `dtype`. `NATIVE_ARCHITECTURES` is the one table of the
architectures Baton's own model code implements.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from baton.core.checkpoint.rope_config import RopeConfig, UnsupportedModelError, rope_config

__all__ = ["NATIVE_ARCHITECTURES", "ModelConfig", "RopeConfig", "UnsupportedModelError"]


@dataclass(frozen=True, slots=True)
class FamilyTraits:
    """What sets a native family apart from Llama, beyond what its config.json says."""

    # The config's `attention_bias` flag biases q/k/v/o (as transformers reads it).
    attention_bias: bool = False
    # q/k/v always biased, o never (Qwen2).
    qkv_bias: bool = False
    qk_norm: bool = False
    # `sliding_window` applies to every layer without a `use_sliding_window` flag.
    sliding_by_default: bool = False
    # Gemma: (1 + w) norms, norms after attention and around the MLP, embeddings scaled by
    # sqrt(hidden), `query_pre_attn_scalar`, logit soft-capping, GeGLU.
    gemma: bool = False
    # The checkpoint saves q/k/v and gate/up already fused (Phi-3).
    fused_checkpoint: bool = False
    # Mixture-of-experts layout: "mixtral", "qwen3_moe" or "gpt_oss"; None for a dense MLP.
    moe: str | None = None
    # A learned logit per query head joins each softmax's denominator (gpt-oss's sinks).
    attention_sinks: bool = False


# The architectures with a native Baton model; anything else is not served natively.
NATIVE_ARCHITECTURES: dict[str, FamilyTraits] = {
    "LlamaForCausalLM": FamilyTraits(attention_bias=True),
    "MistralForCausalLM": FamilyTraits(sliding_by_default=True),
    "Qwen2ForCausalLM": FamilyTraits(qkv_bias=True),
    "Qwen3ForCausalLM": FamilyTraits(attention_bias=True, qk_norm=True),
    "Gemma2ForCausalLM": FamilyTraits(attention_bias=True, gemma=True),
    "Gemma3ForCausalLM": FamilyTraits(attention_bias=True, qk_norm=True, gemma=True),
    "Phi3ForCausalLM": FamilyTraits(sliding_by_default=True, fused_checkpoint=True),
    "MixtralForCausalLM": FamilyTraits(sliding_by_default=True, moe="mixtral"),
    "Qwen3MoeForCausalLM": FamilyTraits(attention_bias=True, qk_norm=True, moe="qwen3_moe"),
    "GptOssForCausalLM": FamilyTraits(attention_bias=True, moe="gpt_oss", attention_sinks=True),
}


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
    hidden_act: str = "silu"
    # Each layer's attention window in tokens (None: global); empty means `sliding_window` for
    # every layer.
    layer_windows: list[int | None] = field(default_factory=list)
    # The rope of sliding layers where it differs from `rope` (Gemma 3's local base frequency).
    local_rope: RopeConfig | None = None
    # Softmax scale of attention; None is head_dim ** -0.5.
    attention_scale: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    # Gemma's extras (see FamilyTraits.gemma).
    gemma: bool = False
    fused_checkpoint: bool = False
    # Mixture of experts: the layout (None: dense), its sizes, and which layers are sparse.
    moe: str | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: list[bool] = field(default_factory=list)
    # gpt-oss's experts: the sigmoid's gain in their SwiGLU and the clamp of its inputs.
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    attention_sinks: bool = False
    # Which model runs it: "native" (baton.gpu.models.model) or "transformers"
    # (baton.gpu.models.transformers_model).
    model_impl: str = "native"

    @property
    def max_model_len(self) -> int:
        return self.max_position_embeddings

    def layer_window(self, layer: int) -> int | None:
        """How many tokens (the query's own included) layer `layer` attends to; None: all."""
        if not self.layer_windows:
            return self.sliding_window
        return self.layer_windows[layer]

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and (not self.moe_layers or self.moe_layers[layer])

    @property
    def freeable_window(self) -> int | None:
        """The window every layer keeps, when all layers slide: KV older than it is never read
        again and its blocks can be freed. None when any layer attends globally."""
        windows = {self.layer_window(i) for i in range(self.num_hidden_layers)}
        if None in windows:
            return None
        return max(windows)  # type: ignore[type-var]

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
        architecture = next((a for a in architectures if a in NATIVE_ARCHITECTURES), None)
        if architecture is None:
            raise UnsupportedModelError(
                f"{path} holds a {architectures or raw.get('model_type')} model; Baton supports "
                f"{', '.join(sorted(NATIVE_ARCHITECTURES))}"
            )
        traits = NATIVE_ARCHITECTURES[architecture]
        attention_bias = traits.attention_bias and bool(raw.get("attention_bias", False))
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        num_layers = raw["num_hidden_layers"]
        global_rope, local_rope = _rope_configs(raw, traits)
        config = cls(
            path=path,
            architecture=architecture,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=global_rope,
            local_rope=local_rope,
            tie_word_embeddings=raw.get("tie_word_embeddings", traits.gemma),
            qkv_bias=traits.qkv_bias or attention_bias,
            o_proj_bias=attention_bias,
            qk_norm=traits.qk_norm,
            dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
            sliding_window=raw.get("sliding_window"),
            layer_windows=_layer_windows(raw, traits, num_layers),
            bos_token_id=raw.get("bos_token_id"),
            hidden_act=raw.get("hidden_activation") or raw.get("hidden_act") or "silu",
            gemma=traits.gemma,
            fused_checkpoint=traits.fused_checkpoint,
            attention_sinks=traits.attention_sinks,
            attn_logit_softcap=raw.get("attn_logit_softcapping") if traits.gemma else None,
            final_logit_softcap=raw.get("final_logit_softcapping") if traits.gemma else None,
        )
        if traits.gemma:
            config.attention_scale = float(raw.get("query_pre_attn_scalar", head_dim)) ** -0.5
        if traits.moe is not None:
            _read_moe(config, raw, traits.moe)
        config.eos_token_ids = _eos_token_ids(raw, path / "generation_config.json")
        return config


def _rope_configs(raw: dict, traits: FamilyTraits) -> tuple[RopeConfig, RopeConfig | None]:
    """The rope of global layers, and of sliding layers where that differs (Gemma 3)."""
    params = raw.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = rope_config(raw, params.get("full_attention") or {"rope_theta": 1e6})
        local = rope_config(raw, params.get("sliding_attention") or {"rope_theta": 1e4})
        return full, local
    rope = rope_config(raw)
    if "rope_local_base_freq" in raw:
        return rope, RopeConfig(theta=float(raw["rope_local_base_freq"]))
    return rope, None


def _layer_windows(raw: dict, traits: FamilyTraits, num_layers: int) -> list[int | None]:
    """Each layer's attention window from `layer_types`, or the family's older rules."""
    window = raw.get("sliding_window")
    if window is None:
        return [None] * num_layers
    if raw.get("layer_types"):
        return [window if t == "sliding_attention" else None for t in raw["layer_types"]]
    if traits.gemma:
        # Gemma 2 alternates (every second layer global), Gemma 3 has a global every sixth.
        pattern = raw.get("sliding_window_pattern", 6 if "rope_local_base_freq" in raw else 2)
        return [window if (i + 1) % pattern else None for i in range(num_layers)]
    if raw.get("use_sliding_window", traits.sliding_by_default):
        first = raw.get("max_window_layers", 0) if "use_sliding_window" in raw else 0
        return [window if i >= first else None for i in range(num_layers)]
    return [None] * num_layers


def _read_moe(config: ModelConfig, raw: dict, layout: str) -> None:
    """The router and experts' sizes (and gpt-oss's SwiGLU); Qwen3-MoE may keep some layers
    dense."""
    config.moe = layout
    config.num_experts = raw.get("num_experts") or raw["num_local_experts"]
    config.num_experts_per_tok = raw["num_experts_per_tok"]
    if layout in ("mixtral", "gpt_oss"):
        config.moe_intermediate_size = config.intermediate_size
        # gpt-oss's softmax over the chosen logits is the renormalized top-k of a full softmax.
        config.norm_topk_prob = True
        if layout == "gpt_oss":
            config.swiglu_alpha = float(raw.get("swiglu_alpha", config.swiglu_alpha))
            config.swiglu_limit = float(raw.get("swiglu_limit", config.swiglu_limit))
        return
    config.moe_intermediate_size = raw["moe_intermediate_size"]
    config.norm_topk_prob = bool(raw.get("norm_topk_prob", False))
    dense = set(raw.get("mlp_only_layers") or [])
    step = raw.get("decoder_sparse_step", 1) or 1
    config.moe_layers = [
        i not in dense and (i + 1) % step == 0 for i in range(config.num_hidden_layers)
    ]


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
