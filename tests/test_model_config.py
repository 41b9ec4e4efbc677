"""Reading config.json without torch: both spellings, EOS from generation_config.json, biases
per family, and a clear refusal of what Baton does not implement."""

from __future__ import annotations

import json

import pytest

from baton.core.checkpoint.model_config import ModelConfig, UnsupportedModelError

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 2048,
    "eos_token_id": 2,
}
LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def write(tmp_path, generation=None, **fields):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **fields}))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return ModelConfig.from_pretrained(tmp_path)


def test_old_and_new_rope_and_dtype_spellings_read_the_same(tmp_path):
    old = write(
        tmp_path,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", **LLAMA3},
        torch_dtype="bfloat16",
    )
    new = write(
        tmp_path,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3},
        dtype="bfloat16",
    )
    assert old.rope == new.rope
    assert new.rope.rope_type == "llama3" and new.rope.theta == 500000.0 and new.rope.factor == 8
    assert old.dtype == new.dtype == "bfloat16"


def test_defaults_fill_gqa_and_head_dim(tmp_path):
    config = write(tmp_path)
    assert config.num_key_value_heads == 4 and config.head_dim == 16
    assert config.rope.theta == 10000.0 and config.rope.rope_type == "default"


def test_eos_ids_merge_config_and_generation_config(tmp_path):
    config = write(tmp_path, generation={"eos_token_id": [2, 7, 9]})
    assert config.eos_token_ids == [2, 7, 9]


def test_bias_follows_each_family(tmp_path):
    qwen2 = write(tmp_path, architectures=["Qwen2ForCausalLM"], attention_bias=False)
    assert qwen2.qkv_bias and not qwen2.o_proj_bias
    llama = write(tmp_path, attention_bias=True)
    assert llama.qkv_bias and llama.o_proj_bias
    mistral = write(tmp_path, architectures=["MistralForCausalLM"], attention_bias=True)
    assert not mistral.qkv_bias and not mistral.o_proj_bias
    assert write(tmp_path, architectures=["Qwen3ForCausalLM"]).qk_norm


def test_sliding_window_applies_per_family_and_per_layer_type(tmp_path):
    mistral = write(tmp_path, architectures=["MistralForCausalLM"], sliding_window=1024)
    assert mistral.max_model_len == 2048
    assert [mistral.layer_window(i) for i in range(2)] == [1024, 1024]
    assert mistral.freeable_window == 1024
    qwen2 = write(
        tmp_path, architectures=["Qwen2ForCausalLM"], sliding_window=1024, use_sliding_window=False
    )
    assert qwen2.layer_window(0) is None and qwen2.freeable_window is None
    gemma2 = write(tmp_path, architectures=["Gemma2ForCausalLM"], sliding_window=64)
    # Gemma 2 without layer_types alternates, sliding first; one global layer frees nothing.
    assert [gemma2.layer_window(i) for i in range(2)] == [64, None]
    assert gemma2.freeable_window is None
    gemma3 = write(
        tmp_path,
        architectures=["Gemma3ForCausalLM"],
        sliding_window=64,
        layer_types=["full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        query_pre_attn_scalar=256,
    )
    assert [gemma3.layer_window(i) for i in range(2)] == [None, 64]
    assert (gemma3.rope.rope_type, gemma3.rope.factor, gemma3.rope.theta) == ("linear", 8.0, 1e6)
    assert gemma3.local_rope is not None and gemma3.local_rope.theta == 1e4
    assert gemma3.attention_scale == 256**-0.5 and gemma3.gemma


def test_moe_configs_read_experts_and_sparse_layers(tmp_path):
    mixtral = write(
        tmp_path, architectures=["MixtralForCausalLM"], num_local_experts=8, num_experts_per_tok=2
    )
    assert (mixtral.num_experts, mixtral.num_experts_per_tok) == (8, 2)
    assert mixtral.moe_intermediate_size == 128 and mixtral.norm_topk_prob
    qwen3_moe = write(
        tmp_path,
        architectures=["Qwen3MoeForCausalLM"],
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        mlp_only_layers=[0],
    )
    assert not qwen3_moe.norm_topk_prob and qwen3_moe.moe_intermediate_size == 32
    assert [qwen3_moe.is_moe_layer(i) for i in range(2)] == [False, True]


def test_unsupported_architecture_names_what_is_supported(tmp_path):
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM") as caught:
        write(tmp_path, architectures=["GPT2LMHeadModel"])
    assert "GPT2LMHeadModel" in str(caught.value)
    with pytest.raises(UnsupportedModelError, match="longrope"):
        write(tmp_path, rope_scaling={"rope_type": "proportional", "factor": 4.0})


def test_missing_config_says_what_the_folder_must_be(tmp_path):
    with pytest.raises(FileNotFoundError, match="Hugging Face checkpoint folder"):
        ModelConfig.from_pretrained(tmp_path)
