"""The generic path: transformers' own modeling code over Baton's paged KV cache serves families
Baton has no native model for, and its greedy output over the OpenAI API equals transformers'
alone, under continuous batching: 12 requests at once, prefill chunks smaller than the prompts,
a KV pool small enough to preempt, and a shared prompt prefix."""

from __future__ import annotations

import asyncio
import logging
import random

import openai
import pytest
import torch

from baton.app.llm import LLM
from baton.core.checkpoint.model_config import UnsupportedModelError
from baton.core.sampling_params import SamplingParams
from baton.core.text.detokenizer import IncrementalDetokenizer
from baton.gpu.models.transformers_model import PackedLinear
from baton.kernels.linear import onednn_linear_available
from tests.server_harness import base_url, model_engine, running_server
from tests.test_greedy_vs_transformers import transformers_greedy
from tests.tiny_transformers import save_tiny_checkpoint

NUM_REQUESTS = 12
NUM_NEW_TOKENS = 12
SHARED_PREFIX = 40
CHUNK = 24
# 12 prompts of up to 80 tokens want far more than 20 blocks of 8: preemption must happen.
NUM_KV_BLOCKS = 20
TINY = dict(vocab_size=512, initializer_range=0.1, tie_word_embeddings=False)

# Families chosen to differ in attention and MLP shape from Llama and from each other.
FAMILIES = {
    # learned absolute positions, Conv1D projections, LayerNorm, GELU MLP
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256)),
    # partial rotary (a quarter of each head), fused qkv, parallel attention and MLP residual
    "gpt_neox": (
        "GPTNeoXConfig",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        | dict(rotary_pct=0.25, max_position_embeddings=256),
    ),
    # half-rotary heads, one shared LayerNorm before parallel attention and GELU MLP
    "phi": (
        "PhiConfig",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        | dict(partial_rotary_factor=0.5, max_position_embeddings=256),
    ),
    # post-norm blocks, RMSNorm over all of q and all of k, GQA
    "olmo2": (
        "Olmo2Config",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        | dict(num_key_value_heads=2, max_position_embeddings=256),
    ),
    # interleaved rotary, LayerNorm without bias, parallel block, scaled logits
    "cohere": (
        "CohereConfig",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        | dict(num_key_value_heads=2, max_position_embeddings=256, logit_scale=0.5),
    ),
}


@pytest.fixture(scope="module")
def generic_checkpoint(tmp_path_factory, hf_tokenizer, make_checkpoint):
    """A tiny random `family` checkpoint saved by transformers itself (Llama: the shared one)."""

    def make(family: str):
        if family == "llama":
            return make_checkpoint("llama")
        config_class, shape = FAMILIES[family]
        out = tmp_path_factory.mktemp(f"generic-{family}")
        return save_tiny_checkpoint(config_class, shape | TINY, hf_tokenizer, out)

    return make


def prompts_with_shared_prefix(seed: int = 0) -> list[list[int]]:
    """Eight prompts open with one 40-token prefix (prefix caching); four share nothing."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 512) for _ in range(SHARED_PREFIX)]
    prompts = []
    for i in range(NUM_REQUESTS):
        tail = [rng.randrange(3, 512) for _ in range(5 + 2 * i)]
        prompts.append(prefix + tail if i % 3 else tail + prefix[:10])
    return prompts


def detokenized(tokenizer, prompt: list[int], token_ids: list[int]) -> str:
    """The text the server streams for `token_ids` after `prompt` (a character may span them)."""
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    return "".join(detokenizer.add(token_id) for token_id in token_ids) + detokenizer.flush()


async def complete_all(state, prompts: list[list[int]]) -> list[str]:
    api = openai.AsyncOpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)
    async with api:
        completions = await asyncio.gather(
            *(
                api.completions.create(
                    model="tiny",
                    prompt=prompt,
                    temperature=0.0,
                    max_tokens=NUM_NEW_TOKENS,
                    extra_body={"ignore_eos": True},
                )
                for prompt in prompts
            )
        )
    return [completion.choices[0].text for completion in completions]


@pytest.mark.slow
@pytest.mark.parametrize("family", [*FAMILIES, "llama"])
def test_generic_path_greedy_over_the_api_equals_transformers(generic_checkpoint, family):
    import transformers

    path = generic_checkpoint(family)
    engine = model_engine(
        path,
        model_impl="transformers",
        max_num_seqs=NUM_REQUESTS,
        max_num_batched_tokens=CHUNK,
        num_kv_blocks=NUM_KV_BLOCKS,
        block_size=8,
    )
    assert engine.executor.model_config.model_impl == "transformers"
    prompts = prompts_with_shared_prefix()
    assert max(map(len, prompts)) > CHUNK
    with running_server(engine, model_name="tiny") as state:
        texts = asyncio.run(complete_all(state, prompts))
    stats = engine.make_stats()
    assert stats.num_preemptions > 0
    assert stats.prefix_cache_hits > 0

    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for prompt, text in zip(prompts, texts, strict=True):
        expected = transformers_greedy(reference.eval(), prompt, NUM_NEW_TOKENS)
        assert text == detokenized(engine.tokenizer, prompt, expected)


@pytest.mark.slow
def test_generic_path_token_ids_equal_transformers_and_the_native_path(make_checkpoint):
    import transformers

    path = make_checkpoint("llama")
    prompts = prompts_with_shared_prefix()[:4]
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    generic = LLM(path, device="cpu", model_impl="transformers", num_kv_blocks=64)
    native = LLM(path, device="cpu", model_impl="native", num_kv_blocks=64)
    if onednn_linear_available():  # as the native model's, the linear layers run packed
        assert any(isinstance(m, PackedLinear) for m in generic.engine.executor.model.modules())
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for prompt, ours, theirs in zip(
        prompts, generic.generate(prompts, params), native.generate(prompts, params), strict=True
    ):
        assert ours.token_ids == theirs.token_ids
        assert ours.token_ids == transformers_greedy(reference.eval(), prompt, NUM_NEW_TOKENS)


def test_an_architecture_without_a_native_model_runs_on_the_generic_path(
    generic_checkpoint, caplog
):
    with caplog.at_level(logging.INFO):
        engine = model_engine(generic_checkpoint("gpt2"), num_kv_blocks=16)
    config = engine.executor.model_config
    assert (config.architecture, config.model_impl) == ("GPT2LMHeadModel", "transformers")
    # The KV shape comes from what the modeling code hands attention, not GPT-2's n_* names.
    assert (config.num_hidden_layers, config.num_key_value_heads, config.head_dim) == (2, 4, 16)
    assert "GPT2LMHeadModel on the generic (transformers' code) path" in caplog.text


def test_a_native_family_runs_natively_unless_forced(make_checkpoint, caplog):
    with caplog.at_level(logging.INFO):
        engine = model_engine(make_checkpoint("llama"), num_kv_blocks=16)
    assert engine.executor.model_config.model_impl == "native"
    assert "LlamaForCausalLM on the native path" in caplog.text


def test_forcing_native_on_an_architecture_baton_lacks_says_so(generic_checkpoint):
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        model_engine(generic_checkpoint("gpt2"), model_impl="native", num_kv_blocks=16)


def test_dummy_weights_from_a_bare_config_run_on_the_generic_path(tmp_path):
    import transformers

    config_file = tmp_path / "gpt2-shape.json"
    config = transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=512
    )
    config.architectures = ["GPT2LMHeadModel"]
    config.to_json_file(config_file)
    llm = LLM(config_file, device="cpu", load_format="dummy", num_kv_blocks=16)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    assert len(llm.generate([[5, 6, 7]], params)[0].token_ids) == 3
    assert llm.engine.executor.model_config.model_impl == "transformers"


@pytest.mark.parametrize(
    ("config_class", "shape", "message"),
    [
        (
            "Gemma2Config",
            dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16)
            | dict(intermediate_size=128, num_key_value_heads=2, attn_logit_softcapping=50.0),
            "Gemma2ForCausalLM soft-caps attention logits",
        ),
        (
            "FalconConfig",
            dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
            "FalconForCausalLM does not route attention through its attention interface",
        ),
    ],
    ids=["softcap", "no-attention-interface"],
)
def test_models_the_generic_path_cannot_page_are_refused_at_load(
    tmp_path, hf_tokenizer, config_class, shape, message
):
    import transformers

    config = getattr(transformers, config_class)(**shape, **TINY)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    hf_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=message):
        model_engine(tmp_path, model_impl="transformers", num_kv_blocks=16)
