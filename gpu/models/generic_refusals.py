"""What the generic path refuses, each with its `RefusalReason`: a transformers causal LM is
served only where Baton's paged KV cache holds everything its layers carry between steps and
its attention is what the paged kernels compute.

Three looks, cheapest first: the config and the class before any weight is read, the modules
once built, and what one probe forward hands the attention interface.
"""

from __future__ import annotations

from torch import nn

from baton.core.checkpoint.unsupported_model import RefusalReason, UnsupportedModelError

# transformers' own layer types for layers that keep conv/SSM/linear-attention state (the cache
# it builds for them is not a KV cache: cache_utils.LinearAttentionCacheLayerMixin).
RECURRENT_LAYER_TYPES = frozenset({"conv", "linear_attention", "hybrid", "hybrid_sliding", "mamba"})
# Config keys that size a recurrent or convolution state, for models that keep a cache class of
# their own rather than declaring layer types (Mamba, RWKV, xLSTM, Recurrent Gemma...).
RECURRENT_CONFIG_KEYS = (
    "ssm_state_size",
    "state_size",
    "conv_L_cache",
    "conv_kernel",
    "mamba_d_state",
    "lru_width",
    "rescale_every",
    "qk_dim_factor",
)
# Module class names of stateful layers, the last net for a model whose config says neither.
RECURRENT_MODULE_MARKERS = ("Mamba", "Rwkv", "LSTM", "ShortConv", "GatedDeltaNet", "Recurrent")
# Attention that reads a learned index or a compressed cache beside the keys and values.
SPARSE_LAYER_TYPES = frozenset(
    {
        "indexed_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "minimax_m3_sparse",
    }
)


def check_config(hf_config, model_class: type) -> None:
    """Refuse from transformers' config object and CausalLM class alone, before the weights."""
    from transformers.models.auto import modeling_auto

    name = model_class.__name__
    text = hf_config.get_text_config(decoder=True)
    layer_types = set(getattr(text, "layer_types", None) or ())
    if _keeps_recurrent_state(hf_config, text, layer_types):
        raise _refusal(name, RefusalReason.RECURRENT_STATE)
    model_type = hf_config.model_type
    if model_type in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        raise _refusal(name, RefusalReason.ENCODER_DECODER)
    if model_type in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES or not name.endswith(
        ("ForCausalLM", "LMHeadModel")
    ):
        raise _refusal(name, RefusalReason.MULTIMODAL)
    if "reuse" in _kv_sharing_modes(text):
        raise _refusal(name, RefusalReason.SHARED_KV)
    if layer_types & SPARSE_LAYER_TYPES:
        raise _refusal(name, RefusalReason.SPARSE_ATTENTION)
    if not model_class.is_backend_compatible():
        raise _refusal(name, RefusalReason.NO_ATTENTION_INTERFACE)


def check_modules(causal_lm: nn.Module) -> None:
    """Refuse a built model with a stateful layer its config did not declare, or whose position
    embeddings count from the padding id (the engine hands positions from 0)."""
    name = type(causal_lm).__name__
    for module in causal_lm.modules():
        if any(marker in type(module).__name__ for marker in RECURRENT_MODULE_MARKERS):
            raise _refusal(name, RefusalReason.RECURRENT_STATE)
    for module in causal_lm.modules():
        if hasattr(module, "create_position_ids_from_input_ids"):
            raise _refusal(name, RefusalReason.POSITIONS_AFTER_PADDING)


def check_probe(
    name: str,
    kv_shapes: list[tuple[int, int, int]],
    *,
    softcapped: bool,
    causal: bool,
    masked: bool,
) -> None:
    """Refuse from what a one-token forward handed the attention interface: each call's
    (KV heads, key size, value size) and whether any soft-capped, was not causal or
    came with a mask the model built itself (transformers builds none for Baton's
    implementation, so a mask there is the model's own bias on the scores)."""
    if not kv_shapes:
        raise _refusal(name, RefusalReason.NO_ATTENTION_INTERFACE)
    if not causal:
        raise _refusal(name, RefusalReason.NOT_CAUSAL)
    if masked:
        raise _refusal(name, RefusalReason.ATTENTION_BIAS)
    if softcapped:
        raise _refusal(name, RefusalReason.ATTENTION_SOFTCAP)
    num_kv_heads = {heads for heads, _, _ in kv_shapes}
    if len(num_kv_heads) > 1:
        raise _refusal(
            name,
            RefusalReason.KV_SHAPES_DIFFER,
            f" ({sorted(num_kv_heads)} KV heads); Baton's cache holds as many in every layer",
        )


# What each reason says after the class name; what to do follows from it in every case: serve
# the model with an engine that implements it natively, or pick a model Baton serves.
EXPLANATIONS = {
    RefusalReason.RECURRENT_STATE: (
        "keeps recurrent or convolution state outside the KV cache (SSM, linear-attention or "
        "short-convolution layers), which Baton does not carry between steps"
    ),
    RefusalReason.ENCODER_DECODER: (
        "is the decoder of an encoder-decoder model and reads an encoder's output; Baton "
        "serves decoder-only causal LMs"
    ),
    RefusalReason.NOT_CAUSAL: (
        "attends to later tokens too (its config's is_decoder is false), so it is not a "
        "causal LM; set is_decoder: true in config.json if it was trained as a decoder"
    ),
    RefusalReason.MULTIMODAL: (
        "is a multimodal model whose generation class takes more than token ids; Baton "
        "serves text-only causal LMs"
    ),
    RefusalReason.NO_ATTENTION_INTERFACE: (
        "does not route attention through its attention interface, so Baton cannot give it a "
        "paged cache"
    ),
    RefusalReason.KV_SHAPES_DIFFER: (
        "hands attention more key/value heads in some layers than in others"
    ),
    RefusalReason.SHARED_KV: (
        "has layers that reuse another layer's or another model's keys and values, where "
        "Baton's cache holds each attention call's own"
    ),
    RefusalReason.ATTENTION_BIAS: (
        "adds its own mask or bias to the attention scores (a learned or ALiBi bias), which "
        "Baton's paged attention does not apply"
    ),
    RefusalReason.ATTENTION_SOFTCAP: (
        "soft-caps attention logits, which Baton's paged attention does not do; it needs a "
        "native model"
    ),
    RefusalReason.POSITIONS_AFTER_PADDING: (
        "numbers positions from its padding token id on (RoBERTa's embeddings), where Baton "
        "hands transformers' code positions counted from 0"
    ),
    RefusalReason.SPARSE_ATTENTION: (
        "attends through a learned index or a compressed cache beside the keys and values, "
        "which Baton's paged cache does not hold"
    ),
}


def _refusal(name: str, reason: RefusalReason, detail: str = "") -> UnsupportedModelError:
    return UnsupportedModelError(f"{name} {EXPLANATIONS[reason]}{detail}", reason)


def _kv_sharing_modes(text) -> list[str]:
    try:
        return list(getattr(text, "kv_sharing_modes", None) or ())
    except ValueError:  # transformers cannot lay the sharing out: nothing to reuse
        return []


def _keeps_recurrent_state(hf_config, text, layer_types: set[str]) -> bool:
    from transformers.cache_utils import DynamicCache, LinearAttentionCacheLayerMixin

    if layer_types & RECURRENT_LAYER_TYPES:
        return True
    if any(getattr(text, key, None) is not None for key in RECURRENT_CONFIG_KEYS):
        return True
    try:
        cache = DynamicCache(config=hf_config)
    except (AttributeError, ValueError, TypeError, KeyError):
        return False  # a config transformers' cache cannot lay out: the later looks decide
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)
