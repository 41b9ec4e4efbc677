"""Speculative decoding changes no token: greedy output is the same with prompt-lookup drafts as
without, alone, batched, in prefill chunks, through preemption and with a warm prefix cache;
logprobs, penalties, logit_bias and stop strings are honoured per verified position; a seeded
request repeats itself."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.structured_output import GuideKind, StructuredOutput
from tests import test_batch_invariance

SPECULATIVE = dict(speculative_method="ngram", num_speculative_tokens=4)
NUM_REQUESTS = 16
# Arrays of one repeated object shape: output a lookup predicts, under a grammar.
ITEMS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "tag": {"enum": ["red", "green", "blue"]}},
        "required": ["id", "tag"],
    },
}


def workload(vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Batch invariance's mixed prompts with answers long enough that drafts run once the
    queue has drained (speculation takes only budget no prefill is owed)."""
    prompts, _ = test_batch_invariance.workload(vocab)
    rng = random.Random(1)
    params = [
        SamplingParams(max_tokens=rng.randint(24, 64), temperature=0.0, ignore_eos=True)
        for _ in range(NUM_REQUESTS)
    ]
    return prompts[:NUM_REQUESTS], params


def speculating(checkpoint, **config) -> LLM:
    """An engine that speculates wherever a lookup finds drafts: its planner prices steps as a
    memory-bound machine's (a draft costs nothing beside the step), not by the measured step
    times, which on a busy machine would decide how many drafts the test exercises."""
    llm = LLM(checkpoint, device="cpu", **SPECULATIVE, **config)
    llm.engine.speculator.cost = CostCoefficients(base_s=1.0, per_prefill_token_s=0.0)
    return llm


def token_ids(results) -> list[list[int]]:
    return [r.token_ids for r in results]


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint):
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def plain(checkpoint):
    """Every request of the workload, batched, without speculation: the reference (batch
    invariance, tests/test_batch_invariance.py, ties it to each request alone)."""
    prompts, params = workload(512)
    llm = LLM(checkpoint, device="cpu", max_num_batched_tokens=256, num_kv_blocks=1024)
    return token_ids(llm.generate(prompts, params))


def assert_drafts_accepted_and_rejected(llm: LLM) -> None:
    """The run exercised both verification outcomes, so equality above means something."""
    stats = llm.engine.make_stats().spec_decode
    assert stats is not None
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_greedy_output_is_the_same_with_speculation_in_chunks_and_a_warm_prefix_cache(
    checkpoint, plain
):
    prompts, params = workload(512)
    llm = speculating(checkpoint, max_num_batched_tokens=16, num_kv_blocks=1024)
    cold = token_ids(llm.generate(prompts, params))
    assert_drafts_accepted_and_rejected(llm)
    hits_before = llm.engine.scheduler.prefix_cache_hits
    warm = token_ids(llm.generate(prompts, params))
    assert llm.engine.scheduler.prefix_cache_hits - hits_before > sum(map(len, prompts)) // 2
    assert cold == plain
    assert warm == plain


def test_greedy_output_is_the_same_with_speculation_alone(checkpoint, plain):
    prompts, params = workload(512)
    llm = speculating(checkpoint, num_kv_blocks=64)
    for i in (0, 5, 11, 15):
        assert llm.generate([prompts[i]], params[i])[0].token_ids == plain[i]


def test_greedy_output_is_the_same_with_speculation_through_preemption(checkpoint, plain):
    prompts, params = workload(512)
    llm = speculating(checkpoint, max_num_batched_tokens=256, num_kv_blocks=40)
    assert token_ids(llm.generate(prompts, params)) == plain
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.kv_cache.pool.num_free_blocks == 40
    assert_drafts_accepted_and_rejected(llm)


def test_logprobs_penalties_bias_and_stops_hold_at_every_verified_position(checkpoint, plain):
    prompts, _ = workload(512)
    # Runs a lookup predicts: the repetition penalty lowers what the history holds, so a draft
    # row that missed its drafts' tokens in the history would pick differently.
    params = [
        SamplingParams(
            max_tokens=40,
            temperature=0.0,
            ignore_eos=True,
            logprobs=2,
            repetition_penalty=1.3,
            frequency_penalty=0.2,
            logit_bias={7: 3.0, 9: -100.0},
            min_tokens=5,
        )
    ] * 4
    plain_llm = LLM(checkpoint, device="cpu", num_kv_blocks=256)
    reference = plain_llm.generate(prompts[:4], params)
    # A stop string from the middle of an answer: the speculating run must cut there too.
    text = reference[1].text
    stopped = [params[0], dataclasses.replace(params[1], stop=[text[20:26]])]
    reference[:2] = plain_llm.generate(prompts[:2], stopped)
    llm = speculating(checkpoint, num_kv_blocks=256)
    results = llm.generate(prompts[:4], [*stopped, *params[2:]])
    assert_drafts_accepted_and_rejected(llm)
    assert reference[1].finish_reason == "stop"
    for got, want in zip(results, reference, strict=True):
        assert got.token_ids == want.token_ids
        assert got.text == want.text
        assert got.finish_reason == want.finish_reason
        assert [t.token_id for t in got.logprobs] == got.token_ids
        for got_lp, want_lp in zip(got.logprobs, want.logprobs, strict=True):
            assert got_lp.logprob == pytest.approx(want_lp.logprob, abs=1e-4)
            assert [t for t, _ in got_lp.top] == [t for t, _ in want_lp.top]


def test_seeded_sampling_gives_the_same_tokens_with_speculation(checkpoint):
    # Verification accepts a draft when the row's own seeded draw is that token, so a seeded
    # request's tokens do not depend on which drafts it was given, or whether any.
    prompts, _ = workload(512)
    params = [
        SamplingParams(max_tokens=32, temperature=0.3, seed=10 + i, ignore_eos=True)
        for i in range(NUM_REQUESTS)
    ]
    plain_llm = LLM(checkpoint, device="cpu", num_kv_blocks=1024)
    llm = speculating(checkpoint, num_kv_blocks=1024)
    batched = token_ids(llm.generate(prompts, params))
    assert batched == token_ids(plain_llm.generate(prompts, params))
    assert llm.generate([prompts[3]], params[3])[0].token_ids == batched[3]
    assert_drafts_accepted_and_rejected(llm)


def test_the_grammar_checks_every_draft_token(checkpoint):
    # A repetitive grammar, so lookups propose runs; some drafts it refuses (the model's own
    # preference between the alternatives decides), which ends their run.
    regex = StructuredOutput(GuideKind.REGEX, "(ab|abc|bca)+ end")
    schema = StructuredOutput(GuideKind.JSON_SCHEMA, json.dumps(ITEMS))
    prompts = ["list: a b c", "some items", "abc abc", "x y z"]
    params = [
        SamplingParams(temperature=0.0, max_tokens=48, structured_output=regex),
        SamplingParams(temperature=0.8, seed=3, max_tokens=64, structured_output=schema),
    ] * 2
    plain = LLM(checkpoint, device="cpu", num_kv_blocks=256).generate(prompts, params)
    llm = speculating(checkpoint, num_kv_blocks=256)
    results = llm.generate(prompts, params)
    assert token_ids(results) == token_ids(plain)
    assert_drafts_accepted_and_rejected(llm)
    for result in results[1::2]:
        if result.finish_reason == "stop":
            json.loads(result.text)
