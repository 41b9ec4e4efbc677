"""Speculation in the engine, on the simulated executor: draft tokens roll back their KV when
rejected, a stop inside an accepted run cuts it there, and the planner gives drafts where a
step is memory-bound or a TPOT target needs them, never where the batch is compute-bound."""

from __future__ import annotations

from baton.app.observability.prometheus import SERIES, Sources
from baton.app.observability.stats_endpoint import spec_decode
from baton.core.kv_cache.kv_cache_manager import blocks_needed
from baton.core.scheduling.speculation import expected_tokens, plan_drafts
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.speculative.acceptance import DraftRecord, SpecDecodeCounters
from baton.core.speculative.ngram_proposer import NgramProposer
from baton.core.speculative.speculator import DRAFT_COST_MEMORY_STEPS, Speculator
from baton.core.step_stats import StepStats
from tests.factory import add_request, make_core_request, make_engine, make_request

SPECULATIVE = dict(speculative_method="ngram", num_speculative_tokens=4)
PROMPT = [5, 6, 7, 8] * 8


def add_scripted(engine, request_id: str, **sampling) -> None:
    """A request whose answer is filler (token 0) until max_tokens: repetitive, so a lookup
    proposes it, and the executor accepts a right draft with its `draft_acceptance`."""
    add_request(engine, make_request(request_id, PROMPT, **sampling))
    engine.executor.script_answer(request_id, None)


def run(engine) -> dict[str, list]:
    outputs: dict[str, list] = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    return outputs


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    proposer = NgramProposer(2, 3)
    assert proposer.propose([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2) == [7, 1]
    # A match one period back continues the repetition past the end.
    assert proposer.propose([4, 5, 4, 5], 5) == [4, 5, 4, 5, 4]
    assert proposer.propose([1, 2, 3, 4], 3) == []
    # Token ids are matched whole, never across a token boundary of their bytes.
    assert proposer.propose([256, 1, 0, 1, 1], 2) == []


def test_rejected_drafts_give_back_their_kv_slots_and_blocks():
    engine = make_engine(block_size=4, num_kv_blocks=64, draft_acceptance=0.5, **SPECULATIVE)
    for i in range(3):
        add_scripted(engine, f"r{i}", max_tokens=40)
    num_tokens = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            num_tokens[output.request_id] = output.num_output_tokens
        # After each step a decode has computed all but its last token, and holds only the
        # blocks its tokens fill: the slots of rejected drafts are back in the pool.
        for request in engine.scheduler.running:
            assert request.num_computed_tokens == request.num_tokens - 1
            table = engine.kv_cache.block_table(request.request_id)
            assert len(table) <= blocks_needed(request.num_tokens, 4)
    stats = engine.make_stats().spec_decode
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert num_tokens == {"r0": 40, "r1": 40, "r2": 40}
    assert engine.kv_cache.pool.num_free_blocks == 64


def test_a_stop_token_inside_an_accepted_run_ends_the_output_there():
    engine = make_engine(**SPECULATIVE)
    # The filler is a stop token, allowed to stop only from the sixth output on: drafts of
    # filler are accepted in runs that straddle the sixth.
    add_scripted(engine, "s", max_tokens=30, stop_token_ids=[0], min_tokens=6)
    outputs = run(engine)["s"]
    tokens = [t for o in outputs for t in o.new_token_ids]
    assert tokens == [0] * 6
    assert outputs[-1].finish_reason == "stop"
    assert outputs[-1].timing is not None
    assert len(outputs[-1].token_times) == 6
    assert engine.make_stats().spec_decode.num_accepted_tokens > 0


def test_max_tokens_is_never_overrun_by_a_run():
    engine = make_engine(**SPECULATIVE)
    for i, max_tokens in enumerate((1, 2, 5, 9, 17)):
        add_scripted(engine, f"r{i}", max_tokens=max_tokens)
    outputs = run(engine)
    for i, max_tokens in enumerate((1, 2, 5, 9, 17)):
        outs = outputs[f"r{i}"]
        assert sum(len(o.new_token_ids) for o in outs) == max_tokens
        assert outs[-1].finish_reason == "length"
    assert engine.make_stats().spec_decode.num_accepted_tokens > 0


def test_expected_tokens_counts_the_accepted_prefix_and_the_token_after_it():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12


def test_planner_speculates_on_a_memory_bound_step():
    # One stream, a step dominated by reading the weights: drafts cost little.
    cost = CostCoefficients(base_s=0.02, per_decode_token_s=1e-4, per_prefill_token_s=2e-4)
    drafts = plan_drafts(
        [0.7], [None], [4], cost, num_prefill_tokens=0, num_context_tokens=100, token_budget=64
    )
    assert drafts == [4]


def test_planner_does_not_speculate_on_a_compute_bound_batch():
    # A full batch whose cost is all per-token compute: a draft costs a decode's share and
    # yields less than a token.
    cost = CostCoefficients(base_s=0.001, per_decode_token_s=1e-3, per_prefill_token_s=1e-3)
    rates = [0.6] * 32
    drafts = plan_drafts(
        rates,
        [None] * 32,
        [4] * 32,
        cost,
        num_prefill_tokens=0,
        num_context_tokens=3200,
        token_budget=256,
    )
    assert drafts == [0] * 32


def test_planner_speculates_for_a_request_that_would_miss_its_tpot_target():
    # Compute-bound, so throughput alone would not speculate; but one request misses its
    # 12 ms target at the 16 ms step and meets it with the yield its drafts bring.
    cost = CostCoefficients(base_s=0.0, per_decode_token_s=1e-3, per_prefill_token_s=1e-3)
    rates = [0.9] + [0.3] * 15
    targets = [0.012] + [None] * 15
    drafts = plan_drafts(
        rates,
        targets,
        [4] * 16,
        cost,
        num_prefill_tokens=0,
        num_context_tokens=1600,
        token_budget=256,
    )
    assert drafts[0] > 0
    assert drafts[1:] == [0] * 15
    step_s = 0.016 + sum(drafts) * 1e-3
    assert step_s / expected_tokens(0.9, drafts[0]) <= 0.012


def test_speculation_stays_out_of_the_budget_owed_to_prefill():
    seen = []
    engine = make_engine(
        max_num_batched_tokens=40, on_batch=lambda b: seen.append(b), **SPECULATIVE
    )
    add_scripted(engine, "decoding", max_tokens=50)
    for _ in range(6):
        engine.step()
    add_request(engine, make_request("long", list(range(10, 400)), max_tokens=2))
    seen.clear()
    while (
        "long" in engine.scheduler.requests
        and engine.scheduler.requests["long"].first_token_time is None
    ):
        engine.step()
    assert all(batch.num_draft_tokens == 0 for batch in seen if batch.num_prefill_tokens)


def test_spec_decode_totals_reach_vllms_series_and_the_stats_endpoint():
    engine = make_engine(draft_acceptance=0.5, **SPECULATIVE)
    add_scripted(engine, "r", max_tokens=40)
    run(engine)
    stats = engine.make_stats()
    spec = stats.spec_decode
    assert spec.num_drafts > 0
    assert sum(spec.accepted_per_position) == spec.num_accepted_tokens
    sources = Sources(stats, None, 0, [])
    series = {s.name: s for s in SERIES if s.name.startswith("spec_decode")}
    assert {name for s in series.values() for name in s.vllm} == {
        "spec_decode_num_drafts",
        "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens",
        "spec_decode_num_accepted_tokens_per_pos",
    }
    assert series["spec_decode_num_draft_tokens"].read(sources) == spec.num_draft_tokens
    assert series["spec_decode_num_accepted_tokens"].read(sources) == spec.num_accepted_tokens
    per_position = series["spec_decode_num_accepted_tokens_per_pos"].read(sources)
    assert per_position[("0",)] == spec.accepted_per_position[0]
    shown = spec_decode(stats)
    assert shown["acceptance_rate"] == spec.num_accepted_tokens / spec.num_draft_tokens
    # An engine that does not speculate exports none of them.
    plain = Sources(make_engine().make_stats(), None, 0, [])
    assert all(s.read(plain) is None for s in series.values())
    assert spec_decode(plain.stats) is None


def test_sampled_requests_learn_their_own_acceptance_prior():
    counters = SpecDecodeCounters()
    for _ in range(10):
        counters.record(4, 0, greedy=False)
        counters.record(4, 4, greedy=True)
    assert counters.prior_rate(False) < 0.1 < 0.9 < counters.prior_rate(True)
    assert counters.snapshot().acceptance_rate == 0.5
    # A request's own evidence outweighs the prior as it grows, and fades back toward it.
    record = DraftRecord()
    record.record(8, 0)
    low = record.rate(0.5)
    for _ in range(20):
        record.fade()
    assert low < 0.2 < record.rate(0.5) <= 0.5


def test_the_planner_charges_drafts_what_they_are_measured_to_add():
    # The fit says a draft is free; the steps that carried four drafts took 40 ms past the
    # fit's 10 ms: a draft costs a whole step, and a half-likely one no longer pays.
    fit = CostCoefficients(base_s=0.01, per_prefill_token_s=0.0, per_decode_token_s=0.0)
    speculator = Speculator(NgramProposer(2, 4), 4, fit)
    drafted = StepStats(0.0, 0.05, 0.05, 1, 0, 1, 100, num_draft_tokens=4)
    for _ in range(100):
        speculator.observe_step(drafted)
    assert abs(speculator.draft_token_s - 0.01) < 1e-4
    request = make_core_request("r", PROMPT + PROMPT[:3], max_tokens=40)
    request.drafts.record(8, 4)  # a rate of about one half
    assert speculator.drafts([request], 64, 0) == [[]]
    unmeasured = Speculator(NgramProposer(2, 4), 4, fit)
    assert unmeasured.drafts([request], 64, 0) == [PROMPT[3:7]]


def test_a_step_stalled_by_the_os_does_not_stop_speculation():
    # Four drafts add 2 ms to a 10 ms step, until one step is preempted for 200 ms: one long
    # sample, which must not price drafts out of the steps after it.
    fit = CostCoefficients(base_s=0.01, per_prefill_token_s=0.0, per_decode_token_s=0.0)
    speculator = Speculator(NgramProposer(2, 4), 4, fit)
    for _ in range(20):
        speculator.observe_step(StepStats(0.0, 0.012, 0.012, 1, 0, 1, 100, num_draft_tokens=4))
    speculator.observe_step(StepStats(0.0, 0.2, 0.2, 1, 0, 1, 100, num_draft_tokens=4))
    assert abs(speculator.draft_token_s - 0.0005) < 1e-5
    request = make_core_request("r", PROMPT + PROMPT[:3], max_tokens=40)
    request.drafts.record(8, 4)  # a rate of about one half: three drafts pay at 0.5 ms each
    assert speculator.drafts([request], 64, 0) == [PROMPT[3:6]]


def test_a_price_measured_on_one_stalled_step_expires():
    # The first drafted step is preempted for 200 ms: its one sample prices every draft out, so
    # no drafted step comes to replace it; once it is old enough it is forgotten and drafting
    # resumes at the fit's price.
    fit = CostCoefficients(base_s=0.01, per_prefill_token_s=0.0, per_decode_token_s=0.0)
    speculator = Speculator(NgramProposer(2, 4), 4, fit)
    speculator.observe_step(StepStats(0.0, 0.2, 0.2, 1, 0, 1, 100, num_draft_tokens=4))
    request = make_core_request("r", PROMPT + PROMPT[:3], max_tokens=40)
    request.drafts.record(8, 4)
    assert speculator.drafts([request], 64, 0) == [[]]
    undrafted = StepStats(0.0, 0.01, 0.01, 1, 0, 1, 100)
    for _ in range(DRAFT_COST_MEMORY_STEPS):
        speculator.observe_step(undrafted)
    assert speculator.draft_token_s == 0.0
    assert speculator.drafts([request], 64, 0) == [PROMPT[3:7]]
