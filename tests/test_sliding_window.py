"""Sliding-window attention over the paged cache: a model whose every layer slides (Mistral with
a window; Starcoder2 on the generic path) equals transformers' greedy output far past the
window, frees and counts the blocks behind it, and serves a request longer than the whole KV
pool; a model with a global layer (Gemma 2; Qwen2 on the generic path) frees nothing. The block
accounting is pinned without torch as well."""

from __future__ import annotations

import random

import pytest

from baton.app.llm import LLM
from baton.core.kv_cache.kv_cache_manager import KVCacheManager
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.step_cost_profile import profile_executor
from tests.factory import make_core_request
from tests.test_greedy_vs_transformers import assert_same_or_near_tie, transformers_greedy

WINDOW = 16


def grow(manager: KVCacheManager, request, num_tokens: int) -> None:
    """Allocate and 'compute' `num_tokens` more tokens of `request`, as a scheduler step does."""
    assert manager.allocate_slots(request, num_tokens)
    request.num_computed_tokens += num_tokens
    manager.cache_computed_blocks(request)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_blocks_behind_the_window_are_freed_once_and_counted(prefix_caching):
    manager = KVCacheManager(16, 4, prefix_caching, sliding_window=6)
    request = make_core_request("r", list(range(3, 43)))
    grow(manager, request, 8)
    grow(manager, request, 2)
    # Blocks are freed as a request grows: the chunk at positions 8..9 saw keys from 3 on, so
    # block 0 (keys 0..3) stayed.
    assert manager.num_window_freed_blocks == 0
    grow(manager, request, 1)
    # Position 10 sees keys 5..10: block 0 is dead, block 1 (4..7) is not.
    assert manager.num_window_freed_blocks == 1
    assert manager.pool.num_free_blocks == 16 - 2
    grow(manager, request, 30)
    grow(manager, request, 1)
    # Position 41 sees keys 36..41: blocks 0..8 dead, blocks 9 and 10 held.
    assert manager.num_window_freed_blocks == 9
    assert manager.pool.num_free_blocks == 16 - 2
    manager.free(request)
    assert manager.pool.num_free_blocks == 16
    assert manager.num_window_freed_blocks == 9


def test_a_model_with_a_global_layer_frees_nothing():
    manager = KVCacheManager(16, 4, False, sliding_window=None)
    request = make_core_request("r", list(range(3, 43)))
    grow(manager, request, 40)
    grow(manager, request, 1)
    assert manager.num_window_freed_blocks == 0
    assert manager.pool.num_free_blocks == 16 - 11


def test_admission_counts_only_the_blocks_a_window_holds_at_once():
    sliding = KVCacheManager(8, 16, False, sliding_window=16)
    assert sliding.max_blocks_held(1000, max_chunk=32) == 4
    assert sliding.max_blocks_held(20, max_chunk=32) == 2
    assert KVCacheManager(8, 16, False).max_blocks_held(1000, max_chunk=32) == 63


def long_prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def reference_model(path):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.slow
def test_windowed_mistral_equals_transformers_past_the_window_and_frees_blocks(make_checkpoint):
    path = make_checkpoint("mistral", sliding_window=WINDOW)
    reference = reference_model(path)
    prompts = long_prompts(reference.config.vocab_size, (40, 57, 90, 3))
    llm = LLM(path, device="cpu", max_num_batched_tokens=32, num_kv_blocks=64)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts, params)
    for prompt, result in zip(prompts, results, strict=True):
        expected = transformers_greedy(reference, prompt, 30)
        assert_same_or_near_tie(reference, prompt, result.token_ids, expected)
    stats = llm.engine.make_stats()
    # The 120-token request alone leaves 6 of its 8 blocks behind the window.
    assert stats.kv_blocks_freed_by_window >= 6
    assert llm.engine.kv_cache.pool.num_free_blocks == 64


@pytest.mark.slow
def test_a_request_longer_than_the_pool_runs_when_every_layer_slides(make_checkpoint):
    path = make_checkpoint("mistral", sliding_window=WINDOW)
    reference = reference_model(path)
    prompt = long_prompts(reference.config.vocab_size, (40,), seed=1)[0]
    # 40 + 100 tokens are 9 blocks; the pool has 5, enough for the window and a 16-token chunk.
    llm = LLM(path, device="cpu", max_num_batched_tokens=16, num_kv_blocks=5)
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    result = llm.generate([prompt], params)[0]
    expected = transformers_greedy(reference, prompt, 100)
    assert_same_or_near_tie(reference, prompt, result.token_ids, expected)
    assert llm.engine.scheduler.num_preemptions == 0


@pytest.mark.slow
def test_gemma2_with_a_global_layer_equals_transformers_and_frees_nothing(make_checkpoint):
    path = make_checkpoint("gemma2")
    reference = reference_model(path)
    prompts = long_prompts(reference.config.vocab_size, (45, 70))
    llm = LLM(path, device="cpu", max_num_batched_tokens=32, num_kv_blocks=64)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    for prompt, result in zip(prompts, llm.generate(prompts, params), strict=True):
        expected = transformers_greedy(reference, prompt, 20)
        assert_same_or_near_tie(reference, prompt, result.token_ids, expected)
    assert llm.engine.make_stats().kv_blocks_freed_by_window == 0


@pytest.mark.slow
def test_freed_blocks_are_reported_in_v1_stats(make_checkpoint):
    import httpx

    from tests.server_harness import base_url, model_engine, running_server

    path = make_checkpoint("mistral", sliding_window=WINDOW)
    engine = model_engine(path, num_kv_blocks=16, max_num_batched_tokens=16)
    prompt = long_prompts(512, (60,), seed=2)[0]
    with running_server(engine) as state:
        url = base_url(state)
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 20, "ignore_eos": True}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        stats = httpx.get(f"{url}/v1/stats").json()
    # The last step computes position 78, whose window starts at 63: blocks 0-2 are behind it.
    assert stats["kv_blocks_freed_by_window"] == 3


def windowed_checkpoint(tmp_path, hf_tokenizer, config_class: str, **window):
    """A tiny random transformers checkpoint of `config_class` with the given window settings."""
    import torch
    import transformers

    config = getattr(transformers, config_class)(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        max_position_embeddings=256,
        vocab_size=512,
        initializer_range=0.1,
        bos_token_id=hf_tokenizer.bos_token_id,
        eos_token_id=hf_tokenizer.eos_token_id,
        **window,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    hf_tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_generic_path_serves_past_the_window_from_a_pool_shorter_than_the_context(
    tmp_path, hf_tokenizer
):
    # Starcoder2 has no native model: every layer slides on transformers' code.
    path = windowed_checkpoint(tmp_path, hf_tokenizer, "Starcoder2Config", sliding_window=WINDOW)
    reference = reference_model(path)
    prompts = long_prompts(512, (90, 23, 5), seed=3)
    # 10 blocks of 8 hold 80 tokens, under the 256-token context and the 102-token request.
    llm = LLM(path, device="cpu", max_num_batched_tokens=32, num_kv_blocks=10, block_size=8)
    executor = llm.engine.executor
    assert executor.model_config.model_impl == "transformers"
    # A server's start-up profiling: prefills of 32 tokens, twice the window, and long decodes.
    profile_executor(llm.engine.step_cost_model, executor, 32, 2, 96, 512)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for prompt, result in zip(prompts, llm.generate(prompts, params), strict=True):
        assert result.token_ids == transformers_greedy(reference, prompt, 12)
    assert llm.engine.make_stats().kv_blocks_freed_by_window >= 9
    assert llm.engine.kv_cache.pool.num_free_blocks == 10


def test_generic_path_with_a_full_layer_beside_a_sliding_one_frees_nothing(tmp_path, hf_tokenizer):
    # Qwen2 slides from layer `max_window_layers` on: layer 0 attends fully, layer 1 slides.
    path = windowed_checkpoint(
        tmp_path,
        hf_tokenizer,
        "Qwen2Config",
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,
    )
    reference = reference_model(path)
    prompts = long_prompts(512, (50, 21), seed=4)
    llm = LLM(path, device="cpu", model_impl="transformers", max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for prompt, result in zip(prompts, llm.generate(prompts, params), strict=True):
        assert result.token_ids == transformers_greedy(reference, prompt, 12)
    assert llm.engine.executor.model_config.layer_windows == [None, WINDOW]
    assert llm.engine.make_stats().kv_blocks_freed_by_window == 0
