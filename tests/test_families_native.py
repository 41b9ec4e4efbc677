"""The native families beyond Llama/Mistral/Qwen (Gemma 2, Gemma 3, Phi-3, Mixtral, Qwen3-MoE)
against transformers' own greedy decoding, on tiny random checkpoints transformers builds: 12
requests at once with prefill chunks smaller than the prompts, a KV pool small enough to
preempt and a shared prefix; and one request per family over the OpenAI API."""

from __future__ import annotations

import asyncio
import random

import openai
import pytest
import torch

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams
from tests.server_harness import base_url, model_engine, running_server
from tests.test_greedy_vs_transformers import assert_same_or_near_tie, transformers_greedy

FAMILIES = ["gemma2", "gemma3", "phi3", "mixtral", "qwen3_moe"]
NUM_REQUESTS = 12
NUM_NEW_TOKENS = 16
# 12 requests of up to 94 tokens need about 60 blocks of 16 at once: 12 forces preemptions.
NUM_KV_BLOCKS = 12
PREFILL_CHUNK = 24


def shared_prefix_workload(vocab: int, seed: int = 0) -> list[list[int]]:
    """Mixed lengths past the prefill chunk and Gemma's 16-token test window; two thirds start
    with one 32-token prefix (two full blocks, so the prefix cache can share them)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(32)]
    prompts = []
    for i in range(NUM_REQUESTS):
        tail = [rng.randrange(3, vocab) for _ in range(rng.randint(26, 46))]
        prompts.append(prefix + tail if i % 3 else tail)
    return prompts


def reference_model(path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_batched_chunked_preempted_greedy_equals_transformers(make_checkpoint, family):
    path = make_checkpoint(family)
    reference = reference_model(path)
    prompts = shared_prefix_workload(reference.config.vocab_size)
    llm = LLM(
        path,
        device="cpu",
        max_num_batched_tokens=PREFILL_CHUNK,
        num_kv_blocks=NUM_KV_BLOCKS,
        max_num_seqs=NUM_REQUESTS,
        # Arrival order, not the SLO policy's timing-fitted plan: the same chunks every run, so
        # an MoE router's near tie (which the logit near-tie rule cannot see) cannot come and go.
        scheduling_policy="fcfs",
    )
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts, params)
    scheduler = llm.engine.scheduler
    assert scheduler.num_preemptions > 0, "the pool was meant to be too small for the batch"
    assert scheduler.prefix_cache_hits > 0, "the shared prefix was meant to be reused"
    for prompt, result in zip(prompts, results, strict=True):
        expected = transformers_greedy(reference, prompt, NUM_NEW_TOKENS)
        assert len(result.token_ids) == NUM_NEW_TOKENS
        assert_same_or_near_tie(reference, prompt, result.token_ids, expected)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_openai_completion_equals_transformers_greedy_text(make_checkpoint, family):
    path = make_checkpoint(family)
    reference = reference_model(path)
    prompts = shared_prefix_workload(reference.config.vocab_size, seed=1)[:3]
    engine = model_engine(path, num_kv_blocks=64, max_num_batched_tokens=PREFILL_CHUNK)
    with running_server(engine, model_name=family) as state:

        async def complete(api: openai.AsyncOpenAI, prompt: list[int]) -> str:
            response = await api.completions.create(
                model=family,
                prompt=prompt,
                max_tokens=NUM_NEW_TOKENS,
                temperature=0.0,
                extra_body={"ignore_eos": True},
            )
            return response.choices[0].text

        async def run() -> list[str]:
            url = f"{base_url(state)}/v1"
            async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as api:
                return await asyncio.gather(*(complete(api, p) for p in prompts))

        texts = asyncio.run(run())
        for prompt, text in zip(prompts, texts, strict=True):
            expected = transformers_greedy(reference, prompt, NUM_NEW_TOKENS)
            assert text == state.tokenizer.decode(expected)
