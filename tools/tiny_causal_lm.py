"""A tiny random checkpoint of any causal LM type the installed transformers knows, built by
transformers itself (`AutoConfig.for_model`, `save_pretrained`) with the tests' tokenizer.

Every type gets the same small shape where its config has the field; `OVERRIDES` holds what a
family needs beyond that, where its defaults are too big, inconsistent once shrunk, or leave
out the layers that make the family what it is (LFM2's convolution layers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Set on a config (and each of its sub-configs) wherever it has the field.
TINY_SHAPE: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    head_dim=16,
    max_position_embeddings=512,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=1,
    shared_expert_intermediate_size=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    initializer_range=0.1,
    tie_word_embeddings=False,
)
# Multi-head latent attention: small low-rank sizes instead of head_dim, and keys for every
# query head (as its checkpoints have; transformers' attention repeats fewer, wrongly).
_MLA = dict(
    head_dim=None,
    num_key_value_heads=4,
    q_lora_rank=48,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    qk_head_dim=24,
)
# Encoders that transformers runs as a causal LM head only with is_decoder set (its own
# advice for their *ForCausalLM classes).
_ENCODERS_AS_DECODERS = (
    "bert",
    "bert-generation",
    "big_bird",
    "camembert",
    "data2vec-text",
    "electra",
    "ernie",
    "megatron-bert",
    "rembert",
    "roberta",
    "roberta-prelayernorm",
    "roc_bert",
    "roformer",
    "xlm-roberta",
    "xlm-roberta-xl",
)
OVERRIDES: dict[str, dict[str, Any]] = {
    **{model_type: dict(is_decoder=True) for model_type in _ENCODERS_AS_DECODERS},
    **{
        model_type: _MLA
        for model_type in (
            "deepseek_v2",
            "deepseek_v3",
            "glm4_moe_lite",
            "minicpm3",
            "sarvam_mla",
            "youtu",
        )
    },
    # Experts routed in groups: the tiny 4 in 2 groups of 2.
    "axk1": _MLA | dict(n_group=2, topk_group=1),
    # Its rotary embedding is sized by head_dim; one layer holds two attention calls.
    "longcat_flash": _MLA | dict(head_dim=8, num_layers=1, zero_expert_num=2),
    "blt": dict(encoder_hash_byte_group_vocab=64),
    "codegen": dict(rotary_dim=8),
    "gptj": dict(rotary_dim=8),
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=256),
    "dory": dict(
        num_hidden_layers=3,
        n_input_layers=1,
        n_recurrent_layers=1,
        n_output_layers=1,
        n_recurrent_loops=1,
    ),
    "lfm2": dict(layer_types=["conv", "full_attention"]),
    "mamba2": dict(num_heads=4, head_dim=32, n_groups=1),
    "prophetnet": dict(
        num_encoder_layers=2,
        num_decoder_layers=2,
        num_encoder_attention_heads=4,
        num_decoder_attention_heads=4,
    ),
    "reformer": dict(is_decoder=True, axial_pos_embds_dim=[32, 32], axial_pos_shape=[16, 32]),
    "xmod": dict(is_decoder=True, languages=["en_XX"], default_language="en_XX"),
    "zaya": dict(num_experts_per_tok=1),
    "gemma4_assistant": dict(hidden_size_per_layer_input=0, head_dim=None),
    **{
        model_type: dict(head_dim=None, global_head_dim=32)
        for model_type in (
            "gemma4",
            "gemma4_text",
            "gemma4_unified",
            "gemma4_unified_assistant",
            "gemma4_unified_text",
        )
    },
    # A window under the sweep's 256-token context: the generic path's windows are issue 42's.
    "modernbert-decoder": dict(local_attention=512),
    "cohere_compass_text": dict(
        layer_types=["full_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    ),
    "dbrx": dict(
        # transformers' default clip_qkv (None) fails its own forward; DBRX's checkpoints clip.
        attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
        ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2),
    ),
    "xlnet": dict(d_head=16, d_inner=128),
    "zamba": dict(layer_types=["mamba", "hybrid"]),
    "zamba2": dict(layer_types=["mamba", "hybrid"], hybrid_layer_ids=[1]),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
}


def tiny_config(model_type: str):
    """transformers' config of `model_type` at TINY_SHAPE, with OVERRIDES applied."""
    from transformers import AutoConfig

    fields = _shrunk_fields(AutoConfig.for_model(model_type))
    fields.update(OVERRIDES.get(model_type, {}))
    return AutoConfig.for_model(model_type, **{k: v for k, v in fields.items() if v is not None})


def write_tiny_checkpoint(model_type: str, out: Path, tokenizer, seed: int = 0):
    """Save a random `model_type` causal LM (weights drawn with `seed`) and `tokenizer` in
    `out`; returns the model, in eval mode, as the reference."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if hasattr(config.get_text_config(), name):
            setattr(config.get_text_config(), name, getattr(tokenizer, name))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model


def _shrunk_fields(config) -> dict[str, Any]:
    from transformers import PretrainedConfig

    fields: dict[str, Any] = {}
    for name, value in vars(config).items():
        if isinstance(value, PretrainedConfig):
            fields[name] = _shrunk_fields(value)
    for name, value in TINY_SHAPE.items():
        # A derived property (Falcon's head_dim) cannot be set.
        if isinstance(getattr(type(config), name, None), property):
            continue
        if _has(config, name):
            # Under the config's own name: its __post_init__ reads that one (DBRX sizes its
            # experts from d_model before an alias such as hidden_size is applied).
            fields[type(config).attribute_map.get(name, name)] = value
    return fields


def _has(config, name: str) -> bool:
    try:
        return hasattr(config, name)
    except Exception:  # a per-layer field read globally (AmbiguousGlobalPerLayerAttributeError)
        return False
