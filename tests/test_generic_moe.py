"""Mixture-of-experts models and Llama 4 on the generic path: transformers' own modeling code
over Baton's paged cache gives transformers' greedy tokens, for one request alone, several
batched, and prompts longer than the prefill chunk; Llama 4's chunked layers see only their own
chunk, and its no-rope layers scale queries by each token's true position."""

from __future__ import annotations

import random

import pytest
import torch

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams
from tests.test_greedy_vs_transformers import transformers_greedy
from tests.tiny_transformers import save_tiny_checkpoint

NUM_NEW_TOKENS = 10
CHUNK = 16
TINY = dict(vocab_size=512, initializer_range=0.1, tie_word_embeddings=False)
DENSE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
DENSE |= dict(num_hidden_layers=2, max_position_embeddings=256)

# Each family routes its experts its own way: softmax top-k with a gated shared expert
# (Qwen2-MoE), without renormalising (OLMoE), renormalised top-2 (Mixtral), sigmoid group
# routing behind a dense first layer, with MLA attention (DeepSeek-V3).
MOE_FAMILIES = {
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
        | dict(shared_expert_intermediate_size=64),
    ),
    "olmoe": ("OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "deepseek_v3": (
        "DeepseekV3Config",
        dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
        | dict(n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)
        | dict(kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8)
        | dict(v_head_dim=16),
    ),
}
# Four layers: chunked rope layers with an MoE feed-forward on every second layer, and full
# no-rope layers whose query temperature (floor_scale 4) changes every few tokens.
LLAMA4 = dict(num_hidden_layers=4, intermediate_size_mlp=96, num_local_experts=4)
LLAMA4 |= dict(num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layer_interval=2)
LLAMA4 |= dict(attention_chunk_size=CHUNK, floor_scale=4, attn_scale=0.5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, hf_tokenizer):
    """A tiny random checkpoint of transformers' `config_class`, saved by transformers."""

    def make(name: str, config_class: str, shape: dict):
        out = tmp_path_factory.mktemp(f"generic-{name}")
        return save_tiny_checkpoint(config_class, DENSE | shape | TINY, hf_tokenizer, out)

    return make


def random_prompts(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in lengths]


def assert_alone_and_batched_equal_transformers(path, prompts: list[list[int]]) -> LLM:
    import transformers

    assert max(map(len, prompts)) > CHUNK
    llm = LLM(
        path,
        device="cpu",
        model_impl="transformers",
        max_num_batched_tokens=CHUNK,
        num_kv_blocks=64,
        block_size=8,
    )
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    alone = llm.generate(prompts[:1], params)[0]
    batched = llm.generate(prompts, params)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    expected = [transformers_greedy(reference.eval(), p, NUM_NEW_TOKENS) for p in prompts]
    assert alone.token_ids == expected[0]
    assert [result.token_ids for result in batched] == expected
    return llm


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_models_on_the_generic_path_equal_transformers(checkpoint, family):
    path = checkpoint(family, *MOE_FAMILIES[family])
    llm = assert_alone_and_batched_equal_transformers(path, random_prompts((37, 5, 21)))
    assert llm.engine.executor.model_config.model_impl == "transformers"


def test_llama4_equals_transformers_past_its_attention_chunks(checkpoint):
    path = checkpoint("llama4", "Llama4TextConfig", LLAMA4)
    # The longest sequence crosses three chunk boundaries; the shortest stays in its first chunk.
    llm = assert_alone_and_batched_equal_transformers(path, random_prompts((45, 6, 19), seed=1))
    config = llm.engine.executor.model_config
    assert config.architecture == "Llama4ForCausalLM"
    # Full no-rope layers keep every block.
    assert config.layer_windows == [CHUNK, None, CHUNK, None]
    assert llm.engine.make_stats().kv_blocks_freed_by_window == 0


def test_gpt_oss_sinks_on_the_generic_path_equal_transformers(checkpoint):
    from safetensors.torch import load_file, save_file

    path = checkpoint(
        "gpt_oss",
        "GptOssConfig",
        dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    )
    # Random sinks sit near 0, where dropping them barely moves a token: spread them so a
    # kernel that ignored them diverges at once.
    weights = load_file(path / "model.safetensors")
    for name in [n for n in weights if n.endswith(".self_attn.sinks")]:
        weights[name] = torch.linspace(-1.0, 3.0, weights[name].numel())
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    llm = assert_alone_and_batched_equal_transformers(path, random_prompts((29, 6, 17), seed=2))
    assert llm.engine.executor.model_config.model_impl == "transformers"
