"""Scheduler mechanism on a simulated clock with a model-free executor: budgets, chunked prefill,
decodes first, preemption and resumption, admission refusal, static batching, prefix hits."""

from __future__ import annotations

import random

import pytest

from baton.core.batch import Batch
from baton.core.engine import Engine
from baton.core.request import EngineRequest, FinishReason, RequestStatus
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from tests.factory import VOCAB_SIZE, add_request, make_engine, make_request


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_SIZE) for _ in range(n)]


def run_to_completion(engine: Engine, max_steps: int = 10_000) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests:
            return tokens
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
    raise AssertionError("requests did not finish")


def scheduled_steps(engine: Engine, max_steps: int = 10_000):
    """Run the engine's own steps and yield the batch each one ran."""
    batches: list[Batch] = []
    engine.executor.on_batch = batches.append
    for _ in range(max_steps):
        if not engine.has_unfinished_requests:
            return
        engine.step()
        yield from batches
        batches.clear()


def test_every_step_respects_token_budget_and_sequence_cap():
    engine = make_engine(max_num_seqs=8, max_num_batched_tokens=64)
    rng = random.Random(1)
    for i in range(40):
        max_tokens = rng.randint(1, 40)
        add_request(
            engine, make_request(f"r{i}", prompt(rng.randint(1, 200), i), max_tokens=max_tokens)
        )
    steps = list(scheduled_steps(engine))
    assert steps
    for batch in steps:
        assert 0 < batch.num_tokens <= 64
        assert len(batch) <= 8
        assert len({s.request_id for s in batch.sequences}) == len(batch)


def test_long_prompt_is_split_into_chunks_and_samples_only_after_the_last():
    engine = make_engine(max_num_batched_tokens=32)
    add_request(engine, make_request("long", prompt(100), max_tokens=2))
    chunks = []
    for batch in scheduled_steps(engine):
        (seq,) = batch.sequences
        chunks.append((seq.start_position, len(seq.token_ids), seq.sample))
    assert chunks == [
        (0, 32, False),
        (32, 32, False),
        (64, 32, False),
        (96, 4, True),
        (100, 1, True),
    ]


def test_decodes_ride_in_every_step_while_a_long_prompt_prefills():
    engine = make_engine(max_num_batched_tokens=40)
    for i in range(4):
        add_request(engine, make_request(f"d{i}", prompt(8, i), max_tokens=30))
    engine.step()  # all four prefill together
    add_request(engine, make_request("long", prompt(300, 9), max_tokens=1))
    steps = scheduled_steps(engine)
    for _ in range(6):
        batch = next(steps)
        decodes = [s.request_id for s in batch.sequences if len(s.token_ids) == 1]
        prefill = [s for s in batch.sequences if s.request_id == "long"]
        assert decodes == ["d0", "d1", "d2", "d3"]
        assert len(prefill[0].token_ids) == 36, "the prefill chunk takes the rest of the budget"
        assert batch.num_decode_tokens == 4 and batch.num_prefill_tokens == 36


def test_preempted_request_resumes_with_the_same_output():
    lengths = [(40, 60), (50, 50), (30, 70)]

    def add_all(engine):
        for i, (n_prompt, n_out) in enumerate(lengths):
            add_request(engine, make_request(f"r{i}", prompt(n_prompt, i), max_tokens=n_out))

    alone = {}
    for i, (n_prompt, n_out) in enumerate(lengths):
        engine = make_engine()
        add_request(engine, make_request(f"r{i}", prompt(n_prompt, i), max_tokens=n_out))
        alone.update(run_to_completion(engine))

    # 3 requests need up to 7 blocks each; 14 blocks force preemptions.
    tight = make_engine(num_kv_blocks=14)
    add_all(tight)
    together = run_to_completion(tight)
    assert tight.scheduler.num_preemptions > 0
    assert together == alone
    assert tight.kv_cache.pool.num_free_blocks == 14


def test_victim_is_the_latest_arrival_under_fcfs():
    engine = make_engine(num_kv_blocks=8, block_size=4)
    add_request(engine, make_request("early", prompt(12, 1), max_tokens=16))
    add_request(engine, make_request("late", prompt(12, 2), max_tokens=16))
    for _ in range(20):
        engine.step()
        late = engine.scheduler.requests.get("late")
        if late is not None and late.num_preemptions:
            break
    early = engine.scheduler.requests["early"]
    assert late.num_preemptions == 1 and early.num_preemptions == 0
    assert late.status in (RequestStatus.PREEMPTED, RequestStatus.RUNNING)


def test_request_that_can_never_fit_is_refused_at_admission():
    engine = make_engine(num_kv_blocks=4, block_size=16)
    with pytest.raises(InvalidRequestError, match="KV blocks"):
        add_request(engine, make_request("big", prompt(50), max_tokens=20))
    with pytest.raises(InvalidRequestError, match="context length"):
        add_request(make_engine(max_model_len=64), make_request("x", prompt(60), max_tokens=10))
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        add_request(engine, make_request("bad", [VOCAB_SIZE]))
    with pytest.raises(InvalidRequestError, match="empty"):
        add_request(engine, make_request("empty", []))
    assert not engine.has_unfinished_requests


def test_max_tokens_defaults_to_the_room_left_in_the_context():
    engine = make_engine(max_model_len=40)
    shared = SamplingParams(max_tokens=None)
    add_request(engine, EngineRequest("a", prompt(30), shared))
    assert run_to_completion(engine)["a"].__len__() == 10
    assert shared.max_tokens is None, "the caller's params are not modified"


def test_static_batching_never_admits_into_a_running_batch():
    engine = make_engine(scheduling_policy="static", max_num_seqs=4, max_num_batched_tokens=16)
    for i in range(3):
        add_request(engine, make_request(f"a{i}", prompt(40, i), max_tokens=5 + 5 * i))
    first = engine.scheduler.schedule(0.0)
    assert {s.request_id for s in first.sequences} == {"a0", "a1", "a2"}
    assert first.num_prefill_tokens == 120, "static prefills the whole batch at once"
    engine.scheduler.update(first, engine.executor.execute(first))
    add_request(engine, make_request("late", prompt(10, 7), max_tokens=3))
    batch_sizes = []
    for batch in scheduled_steps(engine):
        ids = {s.request_id for s in batch.sequences}
        if "late" in ids:
            assert ids == {"late"}, "the late request runs only after the batch drained"
        batch_sizes.append(len(ids))
    assert batch_sizes[:4] == [3, 3, 3, 3]


def test_abort_frees_blocks_before_the_next_step():
    engine = make_engine(num_kv_blocks=32)
    add_request(engine, make_request("a", prompt(100), max_tokens=50))
    engine.step()
    assert engine.kv_cache.pool.num_free_blocks < 32
    output = engine.abort_request("a")
    assert output.finished and output.finish_reason is FinishReason.CANCELLED
    assert engine.kv_cache.pool.num_free_blocks == 32
    assert not engine.has_unfinished_requests
    assert engine.abort_request("a") is None


def test_prefix_cache_hit_skips_prefill_of_cached_blocks():
    engine = make_engine(max_num_batched_tokens=512)
    shared = prompt(64, 3)
    add_request(engine, make_request("first", [*shared, 1, 2, 3], max_tokens=2))
    run_to_completion(engine)
    add_request(engine, make_request("second", [*shared, 4, 5], max_tokens=2))
    batch = engine.scheduler.schedule(engine.clock())
    (seq,) = batch.sequences
    assert seq.start_position == 64 and seq.token_ids == [4, 5]
    assert engine.scheduler.requests["second"].num_cached_tokens == 64
    assert engine.scheduler.prefix_cache_hits == 64


def test_prefix_caching_can_be_turned_off():
    engine = make_engine(enable_prefix_caching=False)
    shared = prompt(64, 3)
    add_request(engine, make_request("first", [*shared, 1], max_tokens=2))
    run_to_completion(engine)
    add_request(engine, make_request("second", [*shared, 2], max_tokens=2))
    (seq,) = engine.scheduler.schedule(engine.clock()).sequences
    assert seq.start_position == 0


def test_outputs_are_batch_invariant_across_budgets_and_caches():
    specs = [
        (random.Random(i).randint(1, 300), random.Random(i + 99).randint(1, 60)) for i in range(32)
    ]

    def run(max_batched: int, prefix: bool, blocks: int = 1024) -> tuple[dict, Engine]:
        engine = make_engine(
            num_kv_blocks=blocks, max_num_batched_tokens=max_batched, enable_prefix_caching=prefix
        )
        for i, (n_prompt, n_out) in enumerate(specs):
            add_request(engine, make_request(f"r{i}", prompt(n_prompt, i % 5), max_tokens=n_out))
        return run_to_completion(engine), engine

    reference, _ = run(2048, prefix=False)
    assert [len(reference[f"r{i}"]) for i in range(32)] == [n for _, n in specs]
    for max_batched in (1, 16, 256):
        tokens, engine = run(max_batched, prefix=True)
        assert tokens == reference
        assert engine.scheduler.prefix_cache_hits > 0, "prompts share prefixes: the cache is warm"
    tokens, engine = run(256, prefix=True, blocks=40)
    assert engine.scheduler.num_preemptions > 0
    assert tokens == reference


def test_unset_max_tokens_is_capped_by_what_the_cache_holds():
    engine = make_engine(num_kv_blocks=4, block_size=16, max_model_len=4096)
    add_request(engine, make_request("a", prompt(10), max_tokens=None))
    assert len(run_to_completion(engine)["a"]) == 4 * 16 - 10


def test_steady_decode_steps_ask_the_policy_for_no_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(max_num_seqs=2)
    policy = engine.scheduler.policy
    views = []
    plan = policy.plan
    monkeypatch.setattr(policy, "plan", lambda view: views.append(view) or plan(view))
    for i in range(2):
        add_request(engine, make_request(f"r{i}", prompt(20, seed=i), max_tokens=5))

    outputs = run_to_completion(engine)

    assert all(len(tokens) == 5 for tokens in outputs.values())
    # Only the step that admits both prompts has prefill to plan; the decodes after it do not.
    assert len(views) == 1 and len(views[0].waiting) == 2
