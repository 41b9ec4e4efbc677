"""The step thread: requests go in through a thread-safe inbox, each step's outputs come out in
one delivery, idle means blocked, a failed step fails only what was running."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from baton.core.batch import Batch
from baton.core.engine import INTERNAL_ERROR
from baton.core.engine_stats import EngineStats
from baton.core.outputs import RequestOutput
from baton.core.request import FinishReason
from baton.core.step_loop import StepLoop
from baton.core.structured_output import GuideKind, StructuredOutput
from tests.factory import make_engine, make_request


class Collector:
    def __init__(self) -> None:
        self.deliveries: list[list[RequestOutput]] = []
        self.stats: list[EngineStats] = []
        self.finished: dict[str, RequestOutput] = {}
        self.tokens: dict[str, list[int]] = {}
        self._cond = threading.Condition()

    def __call__(self, outputs: list[RequestOutput], stats: EngineStats) -> None:
        with self._cond:
            self.stats.append(stats)
            if not outputs:
                return
            self.deliveries.append(outputs)
            for output in outputs:
                self.tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
                if output.finished:
                    self.finished[output.request_id] = output
            self._cond.notify_all()

    def wait_finished(self, request_ids: set[str], timeout: float = 10.0) -> None:
        with self._cond:
            done = self._cond.wait_for(lambda: request_ids <= self.finished.keys(), timeout)
        assert done, f"not finished: {request_ids - self.finished.keys()}"


POISON = 99


def fail_on_poison(batch: Batch) -> None:
    """An injected fault: any batch that holds a prompt with the poison token raises."""
    if any(POISON in seq.all_token_ids[: seq.num_prompt_tokens] for seq in batch.sequences):
        raise RuntimeError("injected fault")


def make_loop(on_batch: Callable[[Batch], None] | None = None) -> tuple[StepLoop, Collector]:
    engine = make_engine(
        vocab_size=100, max_model_len=1024, on_batch=on_batch, max_num_batched_tokens=64
    )
    collector = Collector()
    loop = StepLoop(engine, collector)
    loop.start()
    return loop, collector


def test_requests_from_another_thread_finish_with_one_delivery_per_step():
    loop, collector = make_loop()
    try:
        for i in range(5):
            loop.submit(make_request(f"r{i}", [1, 2, 3, i], max_tokens=10))
        collector.wait_finished({f"r{i}" for i in range(5)})
        assert all(len(collector.tokens[f"r{i}"]) == 10 for i in range(5))
        for delivery in collector.deliveries:
            ids = [o.request_id for o in delivery]
            assert len(ids) == len(set(ids)), "one output per request per delivery"
    finally:
        loop.stop(timeout=5)


def test_idle_loop_blocks_instead_of_stepping():
    loop, collector = make_loop()
    try:
        loop.submit(make_request("a", [1, 2], max_tokens=3))
        collector.wait_finished({"a"})
        steps = loop.engine.num_steps
        time.sleep(0.2)
        assert loop.engine.num_steps == steps
        assert loop.is_alive
    finally:
        loop.stop(timeout=5)
    assert not loop.is_alive


def test_abort_from_another_thread_frees_blocks():
    loop, collector = make_loop()
    try:
        loop.submit(make_request("long", list(range(50)), max_tokens=900))
        while "long" not in collector.tokens:
            time.sleep(0.001)
        loop.abort("long")
        collector.wait_finished({"long"})
        assert collector.finished["long"].finish_reason is FinishReason.CANCELLED
        assert loop.engine.kv_cache.pool.num_free_blocks == 256
    finally:
        loop.stop(timeout=5)


def test_request_the_engine_refuses_is_rejected_without_disturbing_others():
    # Validation ran at admission; what the engine itself may still refuse is a constraint
    # its executor cannot compile (the simulated one compiles none).
    loop, collector = make_loop()
    digits = StructuredOutput(GuideKind.REGEX, "[0-9]+")
    try:
        loop.submit(make_request("ok", [1, 2, 3], max_tokens=5))
        loop.submit(make_request("bad", [1, 2], max_tokens=5, structured_output=digits))
        collector.wait_finished({"ok", "bad"})
        assert collector.finished["bad"].finish_reason is FinishReason.ERROR
        assert "does not support" in collector.finished["bad"].error
        assert len(collector.tokens["ok"]) == 5
    finally:
        loop.stop(timeout=5)


def test_a_request_that_skipped_validation_fails_alone():
    loop, collector = make_loop()
    try:
        loop.submit(make_request("ok", [1, 2, 3], max_tokens=5))
        loop.submit(make_request("unchecked", [1, 2], max_tokens=None))
        collector.wait_finished({"ok", "unchecked"})
        assert collector.finished["unchecked"].finish_reason is FinishReason.ERROR
        assert collector.finished["unchecked"].error == INTERNAL_ERROR
        assert len(collector.tokens["ok"]) == 5
        assert loop.is_alive
    finally:
        loop.stop(timeout=5)


def test_fault_fails_only_its_request_and_batch_mates_finish_unharmed():
    clean, clean_collector = make_loop(fail_on_poison)
    faulty, collector = make_loop(fail_on_poison)
    try:
        for loop in (clean, faulty):
            for i in range(4):
                loop.submit(make_request(f"ok{i}", [1, 2, 3, i], max_tokens=20))
        faulty.submit(make_request("poisoned", [1, POISON], max_tokens=20))
        clean_collector.wait_finished({f"ok{i}" for i in range(4)})
        collector.wait_finished({"poisoned", *(f"ok{i}" for i in range(4))})
        assert collector.finished["poisoned"].finish_reason is FinishReason.ERROR
        assert "injected fault" in collector.finished["poisoned"].error_detail
        for i in range(4):
            assert collector.finished[f"ok{i}"].finish_reason is FinishReason.LENGTH
            assert collector.tokens[f"ok{i}"] == clean_collector.tokens[f"ok{i}"]
        faulty.submit(make_request("after", [4, 5], max_tokens=4))
        collector.wait_finished({"after"})
        assert collector.finished["after"].finish_reason is FinishReason.LENGTH
        assert faulty.engine.kv_cache.pool.num_free_blocks == 256
    finally:
        clean.stop(timeout=5)
        faulty.stop(timeout=5)


def test_stop_cancels_what_is_left():
    loop, collector = make_loop()
    loop.submit(make_request("endless", [1], max_tokens=1000))
    while "endless" not in collector.tokens:
        time.sleep(0.001)
    loop.stop(timeout=5)
    assert collector.finished["endless"].finish_reason is FinishReason.CANCELLED


def test_a_scheduling_fault_fails_only_the_request_that_brought_it():
    """A policy that raises on one request's parameters (the class of `int(inf)` on a huge
    SLO) fails that newcomer alone; the requests already running finish in full."""
    loop, collector = make_loop()
    policy = loop.engine.scheduler.policy
    order_waiting = policy.order_waiting

    def poisoned_order(candidates, now):
        if any(request.priority == POISON for request in candidates):
            raise OverflowError("cannot convert float infinity to integer")
        return order_waiting(candidates, now)

    policy.order_waiting = poisoned_order
    try:
        healthy = {f"h{i}" for i in range(3)}
        for request_id in sorted(healthy):
            loop.submit(make_request(request_id, [1, 2, 3], max_tokens=40))
        while not all(collector.tokens.get(request_id) for request_id in healthy):
            time.sleep(0.001)
        loop.submit(make_request("bad", [4, 5], priority=POISON, max_tokens=40))
        collector.wait_finished({*healthy, "bad"})
        assert collector.finished["bad"].finish_reason is FinishReason.ERROR
        assert "cannot convert" not in collector.finished["bad"].error
        for request_id in healthy:
            assert collector.finished[request_id].finish_reason is FinishReason.LENGTH
            assert len(collector.tokens[request_id]) == 40
    finally:
        loop.stop(5)


def test_each_iteration_publishes_a_snapshot_and_the_last_shows_the_engine_idle():
    loop, collector = make_loop()
    try:
        for i in range(3):
            loop.submit(make_request(f"r{i}", [1, 2, 3, i], max_tokens=8))
        collector.wait_finished({"r0", "r1", "r2"})
    finally:
        loop.stop(timeout=5)
    assert max(stats.num_running for stats in collector.stats) == 3
    last = collector.stats[-1]
    assert (last.num_running, last.num_waiting, last.kv_cache_usage) == (0, 0, 0.0)
    assert last.num_steps == loop.engine.num_steps
    assert [s.num_steps for s in collector.stats] == sorted(s.num_steps for s in collector.stats)


def test_a_prefill_only_request_is_handed_off_at_its_first_token_on_the_step_thread():
    loop, collector = make_loop()
    try:
        loop.submit(make_request("p", list(range(1, 40)), max_tokens=10), hand_off=True)
        deadline = time.monotonic() + 10
        while "p" not in collector.tokens:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        (handed,) = [o for d in collector.deliveries for o in d if o.request_id == "p"]
        assert handed.prefilled is not None and not handed.finished
        assert collector.tokens["p"] == [handed.prefilled.first_token_id]
        # Calls run on the step thread between steps: its result, or its error, come back.
        thread = loop.call(lambda engine: threading.current_thread().name).result(5)
        assert thread == "baton-step"
        assert loop.call(lambda engine: engine.release_prefilled("p")).result(5) is None
        assert loop.engine.kv_cache.pool.num_free_blocks == 256
        failed = loop.call(lambda engine: engine.read_prefilled_kv("nobody"))
        assert isinstance(failed.exception(5), KeyError)
        assert loop.is_alive
    finally:
        loop.stop(timeout=5)
