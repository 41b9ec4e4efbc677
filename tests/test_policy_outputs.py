"""Greedy outputs do not depend on the scheduling policy: every policy, on a real tiny model,
with small prefill chunks and a KV pool small enough to force preemptions, produces the same
tokens for every request as FCFS does."""

from __future__ import annotations

import random

import pytest

from baton.app.llm import LLM
from baton.core.config import POLICIES
from baton.core.sampling_params import SamplingParams


def workload(vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(5)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(3, 90))] for _ in range(10)]
    params = [
        SamplingParams(max_tokens=rng.randint(2, 12), temperature=0.0, ignore_eos=True)
        for _ in prompts
    ]
    return prompts, params


def generate(checkpoint, policy: str) -> tuple[list[list[int]], int]:
    llm = LLM(
        checkpoint,
        device="cpu",
        scheduling_policy=policy,
        max_num_batched_tokens=32,
        num_kv_blocks=12,
        enable_prefix_caching=False,
    )
    prompts, params = workload(512)
    results = llm.generate(prompts, params)
    return [r.token_ids for r in results], llm.engine.scheduler.num_preemptions


@pytest.fixture(scope="module")
def reference(llama_checkpoint):
    return generate(llama_checkpoint, "fcfs")[0]


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "fcfs"])
def test_greedy_outputs_are_the_same_under_every_policy(llama_checkpoint, reference, policy):
    outputs, num_preemptions = generate(llama_checkpoint, policy)
    assert outputs == reference
    if policy != "static":
        assert num_preemptions > 0
