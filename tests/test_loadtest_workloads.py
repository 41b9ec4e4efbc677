"""The locust workloads draw from core's request classes: same caps, reproducible per user."""

from __future__ import annotations

import pytest

from baton.core.simulation.workloads import CHAT, LONG_GENERATION, RAG
from loadtest.workloads import RequestSampler, WorkloadConfig


def prompt_words(spec) -> int:
    """Words in the user message before its closing question line."""
    return len(spec.messages[-1]["content"].split("\n")[0].split())


@pytest.mark.parametrize(
    ("workload", "request_class"),
    [("chat", CHAT), ("rag", RAG), ("long-generation", LONG_GENERATION)],
)
def test_each_workload_draws_within_its_class(workload, request_class):
    sampler = RequestSampler(WorkloadConfig(workload=workload), 0)
    specs = [sampler.sample() for _ in range(201)]
    assert all(1 <= s.max_tokens <= request_class.max_tokens for s in specs)
    assert all(1 <= prompt_words(s) <= request_class.prompt.ceiling for s in specs)
    # Log-normal around the class median: the sample median lands near it.
    median = sorted(prompt_words(s) for s in specs)[100]
    assert 0.7 * request_class.prompt.median < median < 1.4 * request_class.prompt.median


def test_mixed_is_chat_and_rag_and_reproducible_per_user():
    config = WorkloadConfig(workload="mixed", seed=3)
    assert RequestSampler(config, 7).sample() == RequestSampler(config, 7).sample()
    assert RequestSampler(config, 7).sample() != RequestSampler(config, 8).sample()
    sampler = RequestSampler(config, 9)
    specs = [sampler.sample() for _ in range(400)]
    # No long generation in the mix: no output cap above chat's and RAG's.
    assert all(s.max_tokens <= max(CHAT.max_tokens, RAG.max_tokens) for s in specs)
    rag_like = sum(prompt_words(s) > 600 for s in specs) / len(specs)
    assert 0.2 < rag_like < 0.4  # 30% RAG


def test_fixed_lengths_override_the_draw():
    spec = RequestSampler(
        WorkloadConfig(workload="rag", prompt_tokens=12, max_tokens=5), 0
    ).sample()
    assert prompt_words(spec) == 12 and spec.max_tokens == 5
