"""A request's output does not depend on its company: alone, in a batch of 32 mixed-length
requests, with prefill chunks of 1, 16 and 256 tokens, with a cold or warm prefix cache, and
when forced through preemption by a pool too small for the batch; and on the CPU its logprobs are
bitwise the same alone and batched."""

from __future__ import annotations

import random

import pytest

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams

NUM_REQUESTS = 32


def workload(vocab: int, seed: int = 0) -> tuple[list[list[int]], list[SamplingParams]]:
    """Mixed lengths; half the prompts share one of two system-prompt-like prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, vocab) for _ in range(40)] for _ in range(2)]
    prompts, params = [], []
    for i in range(NUM_REQUESTS):
        tail = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 200))]
        prompts.append(prefixes[i % 2] + tail if i % 4 < 2 else tail)
        params.append(
            SamplingParams(max_tokens=rng.randint(1, 24), temperature=0.0, ignore_eos=True)
        )
    return prompts, params


def token_ids(results) -> list[list[int]]:
    return [r.token_ids for r in results]


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint):
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def alone(checkpoint):
    """Each request run by itself on a fresh engine: the reference."""
    prompts, params = workload(512)
    outputs = []
    for prompt, p in zip(prompts, params, strict=True):
        llm = LLM(checkpoint, device="cpu", num_kv_blocks=64, enable_prefix_caching=False)
        outputs.append(llm.generate([prompt], p)[0].token_ids)
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [16, 256])
def test_batched_output_equals_alone_for_every_prefill_chunk_size(checkpoint, alone, chunk):
    prompts, params = workload(512)
    llm = LLM(checkpoint, device="cpu", max_num_batched_tokens=chunk, num_kv_blocks=1024)
    assert token_ids(llm.generate(prompts, params)) == alone


@pytest.mark.slow
def test_one_token_chunks_give_the_same_output(checkpoint, alone):
    prompts, params = workload(512)
    subset = slice(0, 8)
    llm = LLM(checkpoint, device="cpu", max_num_batched_tokens=1, num_kv_blocks=256)
    assert token_ids(llm.generate(prompts[subset], params[subset])) == alone[subset]


@pytest.mark.slow
def test_warm_prefix_cache_gives_the_same_output(checkpoint, alone):
    prompts, params = workload(512)
    llm = LLM(checkpoint, device="cpu", max_num_batched_tokens=256, num_kv_blocks=1024)
    cold = token_ids(llm.generate(prompts, params))
    hits_before = llm.engine.scheduler.prefix_cache_hits
    warm = token_ids(llm.generate(prompts, params))
    assert llm.engine.scheduler.prefix_cache_hits - hits_before > sum(map(len, prompts)) // 2
    assert cold == alone
    assert warm == alone


@pytest.mark.slow
def test_preempted_requests_give_the_same_output(checkpoint, alone):
    prompts, params = workload(512)
    llm = LLM(checkpoint, device="cpu", max_num_batched_tokens=256, num_kv_blocks=48)
    results = token_ids(llm.generate(prompts, params))
    assert llm.engine.scheduler.num_preemptions > 0
    assert results == alone
    assert llm.engine.kv_cache.pool.num_free_blocks == 48


@pytest.mark.slow
def test_seeded_sampling_is_the_same_alone_and_batched(checkpoint):
    prompts, _ = workload(512, seed=1)
    params = [
        SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=100 + i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    llm = LLM(checkpoint, device="cpu", max_num_batched_tokens=64, num_kv_blocks=1024)
    batched = token_ids(llm.generate(prompts, params))
    for i in (0, 5, 17, 31):
        solo = LLM(checkpoint, device="cpu", num_kv_blocks=64)
        assert solo.generate([prompts[i]], params[i])[0].token_ids == batched[i]
    unseeded = [SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)] * 2
    first, second = llm.generate([prompts[0]] * 2, unseeded)
    assert first.token_ids != second.token_ids, "unseeded requests draw their own noise"


def test_engine_seed_makes_unseeded_sampling_repeatable(checkpoint):
    prompt = workload(512)[0][3]
    params = SamplingParams(max_tokens=10, temperature=1.0, ignore_eos=True)

    def run(seed: int) -> list[int]:
        llm = LLM(checkpoint, device="cpu", num_kv_blocks=64, seed=seed)
        return llm.generate([prompt], params)[0].token_ids

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_cpu_logprobs_are_bitwise_the_same_alone_batched_and_in_any_prefill_chunking(checkpoint):
    # Stronger than equal greedy tokens: on the CPU every kernel a request's rows pass through
    # gives them the same bits whatever shares the step (Baton's linears, the C++ attention
    # kernel, row-wise norms), so its logprobs match to the last bit. That holds for the prefill
    # too: the kernel attends each prompt row on its own, so a prompt in one chunk, in chunks of
    # 16 tokens between other requests', or after a cached prefix gives the same bits.
    prompts, _ = workload(512, seed=3)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=4)
    tracked = prompts[5]

    def logprobs(llm: LLM, batch: list[list[int]], index: int) -> list:
        result = llm.generate(batch, params)[index].logprobs
        return [(t.token_id, t.logprob, t.top) for t in result]

    one_chunk = LLM(checkpoint, device="cpu", max_num_batched_tokens=8192)
    alone = logprobs(one_chunk, [tracked], 0)
    assert logprobs(one_chunk, prompts[:12], 5) == alone
    # The second time round the prompt's full blocks come from the prefix cache.
    hits_before = one_chunk.engine.scheduler.prefix_cache_hits
    assert logprobs(one_chunk, prompts[:12], 5) == alone
    assert one_chunk.engine.scheduler.prefix_cache_hits > hits_before
    chunked = LLM(checkpoint, device="cpu", max_num_batched_tokens=16, enable_prefix_caching=False)
    assert logprobs(chunked, prompts[:12], 5) == alone
