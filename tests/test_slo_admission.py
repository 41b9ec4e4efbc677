"""SLO admission control: a request is refused only when the queue ahead makes its TTFT target
hopeless (predicted past the factor, while it would fit on an idle engine), and the server
answers that with 429, `rate_limit_error` and a Retry-After of the predicted drain time."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from baton.core.engine import Engine
from baton.core.outputs import RequestOutput
from baton.core.request import SLO, FinishReason
from baton.core.scheduling.step_cost import CostCoefficients, StepCostModel
from baton.core.scheduling.ttft_forecast import TTFTForecast
from baton.core.text.tokenizer import Tokenizer
from tests.factory import add_request, make_engine, make_request
from tests.server_harness import base_url, running_server, simulated_engine
from tests.test_backpressure import GatedExecutor, wait_for

COST = CostCoefficients(
    base_s=0.01, per_prefill_token_s=1e-4, per_decode_token_s=2e-4, per_context_token_s=0.0
)


def forecast_with_queue(num_queued: int, ttft_ms: float | None) -> TTFTForecast:
    forecast = TTFTForecast(StepCostModel(COST), 2048, max_num_seqs=64, max_wait_s=20.0)
    for i in range(num_queued):
        forecast.add(f"q{i}", 2000, SLO(ttft_ms, None), now=0.0)
    return forecast


def test_empty_engine_predicts_only_the_request_itself():
    prediction = forecast_with_queue(0, None).predict(1000, 500, now=0.0)
    assert prediction.ttft_s == prediction.alone_s == 0.01 + 1000 * 1e-4
    assert prediction.drain_s == 0.01


def test_queue_with_earlier_deadlines_counts_ahead_and_later_ones_do_not():
    earlier_queue = forecast_with_queue(20, 10_000)
    behind = earlier_queue.predict(1000, 20_000, now=0.0)
    assert behind.ttft_s > 4.0  # 41,000 tokens at 2,048 per 0.21 s step
    loose_queue = forecast_with_queue(20, 60_000)
    ahead = loose_queue.predict(1000, 2000, now=0.0)
    # Served first: its first token ends the first step, which the queue fills to the budget.
    assert ahead.ttft_s == pytest.approx(0.01 + 2048 * 1e-4)
    assert ahead.alone_s == pytest.approx(0.01 + 1000 * 1e-4)
    assert ahead.drain_s == behind.drain_s - 0.0  # same owed work either way
    assert ahead.drain_s > 4.0


def test_requests_out_of_reach_do_not_count_ahead():
    # Only about five of twenty 2,000-token prompts fit a 1 s target; once waiting 1 s, the
    # rest are out of reach and go after a request due in 2 s, so they do not delay it.
    tight_queue = forecast_with_queue(20, 1000)
    prediction = tight_queue.predict(1000, 2000, now=1.0)
    assert prediction.ttft_s == pytest.approx(0.01 + 2048 * 1e-4)
    assert prediction.drain_s > 4.0


def test_a_request_predicted_past_its_deadline_is_refused_only_past_the_factor():
    # Behind twenty prompts with earlier deadlines it would miss its 2 s target: out of reach,
    # the planner serves it after them all (43,000 tokens, 21 steps of 2,048, 4.51 s).
    prediction = forecast_with_queue(20, 1000).predict(3000, 2000, now=0.0)
    assert prediction.ttft_s == pytest.approx(21 * 0.01 + 43_000 * 1e-4)
    assert prediction.refuses(2000, factor=2.0)  # past 4 s
    assert not prediction.refuses(2000, factor=3.0)  # within 6 s


def test_first_tokens_settle_owed_prefill_and_turn_into_decodes():
    forecast = forecast_with_queue(3, 1000)
    before = forecast.predict(100, 1000, now=0.0)
    for i in range(3):
        forecast.first_token(f"q{i}", now=0.0)
    after = forecast.predict(100, 1000, now=0.0)
    assert forecast.num_owed == 0
    assert after.ttft_s < before.ttft_s
    assert after.alone_s > before.alone_s  # three decodes now ride in every step
    forecast.remove("q0")
    forecast.remove("missing")
    assert forecast.num_owed == 0


def test_a_full_batch_makes_a_request_wait_for_its_place():
    """A full batch, places freeing every 0.1 s (the engine's mean lifetime of 6.4 s over 64
    places), three requests waiting for one with the same deadline: a new urgent request gets
    the fourth."""
    forecast = TTFTForecast(StepCostModel(COST), 2048, max_num_seqs=64, max_wait_s=20.0)
    forecast.lifetime_s = 6.4
    for i in range(64):
        forecast.add(f"running{i}", 100, SLO(None, None), now=-1.0)
        forecast.first_token(f"running{i}", now=-1.0)
    for i in range(3):
        forecast.add(f"waiting{i}", 100, SLO(500, None), now=0.0)

    # A step beside the 64 decodes carrying `n` prefill tokens. With no place open the queue
    # cannot share a step: each request's prompt goes alone once its place frees.
    def step_s(n: int) -> float:
        return 0.01 + 64 * 2e-4 + n * 1e-4

    urgent = forecast.predict(100, 500, now=0.0)
    assert urgent.ttft_s == pytest.approx(0.4 + step_s(100))  # 4 places at 0.1 s each
    assert not urgent.refuses(500, factor=3.0)
    patient = forecast.predict(2000, 5000, now=0.0)
    # Its 2,000 tokens take two steps of 1,984 (the budget less the decodes).
    assert patient.ttft_s == pytest.approx(0.4 + 2 * step_s(0) + 2000 * 1e-4)
    # Due before the others, it takes the first place to free.
    hasty = forecast.predict(100, 300, now=0.0)
    assert hasty.ttft_s == pytest.approx(0.1 + step_s(100))


def completion(ttft_ms: float | None, prompt_len: int = 1500) -> dict:
    body = {"prompt": [5] * prompt_len, "max_tokens": 2, "stream": True, "ignore_eos": True}
    if ttft_ms is not None:
        body["slo"] = {"ttft_ms": ttft_ms}
    return body


SLOWDOWN = 5


def test_server_refuses_hopeless_ttft_with_429_and_serves_the_rest(llama_checkpoint):
    vocab_size = Tokenizer.from_pretrained(llama_checkpoint).vocab_size
    executor = GatedExecutor(vocab_size)
    engine = simulated_engine(
        llama_checkpoint,
        executor,
        scheduling_policy="slo",
        max_num_seqs=64,
        slo_admission_factor=2.0,
    )
    # Steps 5x slower than COST's and 5 s targets: the same queue as 1 s at COST, but a request
    # still counts as on time ahead of the next one however slowly the test sends them (a slow
    # machine took over 1 s for a dozen, and requests past their deadline do not count ahead).
    engine.step_cost_model.coefficients[:] = [SLOWDOWN * c for c in COST.as_tuple()]
    with running_server(engine) as state:
        url = base_url(state)
        statuses: list[int] = []
        refusals: list[tuple[dict, httpx.Headers]] = []
        threads: list[threading.Thread] = []

        def stream(body: dict) -> None:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
                if response.status_code == 429:
                    response.read()
                    refusals.append((response.json(), response.headers))
                    return
                statuses.append(response.status_code)
                for _ in response.iter_lines():
                    pass

        def send(body: dict) -> None:
            """Start a streaming request; return once it is in flight or refused."""
            in_flight = state.engine.num_in_flight
            thread = threading.Thread(target=stream, args=(body,), daemon=True)
            thread.start()
            threads.append(thread)
            wait_for(lambda: state.engine.num_in_flight > in_flight or refusals)

        # Tight-deadline requests queue up (no step runs) until the next one's first token is
        # predicted past twice its 5 s target (some dozen prompts of 1,500 tokens at 2,048 per
        # 1.075 s step).
        while not refusals and len(threads) < 30:
            send(completion(1000 * SLOWDOWN))
        assert refusals and 6 <= state.engine.num_in_flight <= 14
        error, headers = refusals[0]
        assert error["error"]["type"] == "rate_limit_error" and "TTFT" in error["error"]["message"]
        # The queue's predicted drain time: 6 to 14 prompts of 1,500 tokens, 5 to 15 s.
        assert SLOWDOWN <= int(headers["retry-after"]) <= 3 * SLOWDOWN

        # Not hopeless, so served even now: no target, a target looser than the queue, a prompt
        # too long for its target even on an idle engine (refusing it would not help).
        for body in (completion(None), completion(300_000), completion(100, prompt_len=3000)):
            send(body)
        assert len(refusals) == 1
        executor.gate.set()
        for thread in threads:
            thread.join(timeout=30)
        assert statuses == [200] * (len(threads) - 1)


def test_other_policies_and_factor_zero_never_refuse(llama_checkpoint):
    vocab_size = Tokenizer.from_pretrained(llama_checkpoint).vocab_size
    for policy, factor in (("fcfs", 2.0), ("slo", 0.0)):
        executor = GatedExecutor(vocab_size)
        engine = simulated_engine(
            llama_checkpoint, executor, scheduling_policy=policy, slo_admission_factor=factor
        )
        engine.step_cost_model.coefficients[:] = COST.as_tuple()
        with running_server(engine) as state:
            url = base_url(state)
            for i in range(20):
                state.engine.forecast.add(f"fake-{i}", 2000, SLO(1000, None), now=0.0)
            executor.gate.set()
            response = httpx.post(
                f"{url}/v1/completions",
                json={**completion(1000), "stream": False},
                timeout=30,
            )
            assert response.status_code == 200, (policy, factor)


def test_a_request_that_would_push_accepted_ones_past_their_deadline_is_refused():
    # Ten prompts of 2,000 tokens due in 2.2 s all make it (the last at 2.1 s: ten steps of
    # 10 ms, 20,000 tokens at 0.1 ms). A newcomer due sooner goes first: with 2,000 tokens it
    # pushes the last one past its deadline, a wash (one on time either way), so it is
    # accepted; with 4,000 it pushes two, so it is refused although it would be on time.
    forecast = forecast_with_queue(10, 2200)
    small = forecast.predict(2000, 1000, now=0.0)
    assert small.ttft_s == pytest.approx(0.2148)
    assert small.displaced == 1 and not small.refuses(1000, factor=3.0)
    pushy = forecast.predict(4000, 1000, now=0.0)
    assert pushy.ttft_s < 1.0
    assert pushy.displaced == 2 and pushy.refuses(1000, factor=3.0)
    # One due after them queues behind them and pushes nobody.
    patient = forecast.predict(2000, 3000, now=0.0)
    assert patient.ttft_s == pytest.approx(11 * 0.01 + 22_000 * 1e-4)
    assert patient.displaced == 0 and not patient.refuses(3000, factor=3.0)


def queued_behind_one_place(factor: float) -> tuple[list[RequestOutput], Engine]:
    """One place in the batch, held by a long request with no target; behind it one with a
    100 ms TTFT target and one with none, until the long one finishes 1 s later."""
    engine = make_engine(
        scheduling_policy="slo",
        max_num_seqs=1,
        slo_admission_factor=factor,
        cost=CostCoefficients(base_s=0.01),
    )
    add_request(engine, make_request("long", [1] * 10, max_tokens=100))
    engine.step()
    for request_id, slo in (("tight", SLO(100, None)), ("untargeted", SLO())):
        add_request(engine, make_request(request_id, [1] * 10, slo=slo, max_tokens=4))
    outputs = []
    while engine.has_unfinished_requests:
        outputs += engine.step()
    return [output for output in outputs if output.finished], engine


def test_a_request_queued_past_the_factor_times_its_target_is_refused_then():
    finished, _ = queued_behind_one_place(factor=2.0)
    by_id = {output.request_id: output for output in finished}
    tight = by_id["tight"]
    assert tight.finish_reason is FinishReason.REFUSED and not tight.new_token_ids
    assert "2 times its TTFT target of 100 ms" in tight.error
    # Refused at the first step past 200 ms of waiting (steps of 10 ms).
    assert 200 < tight.timing.e2e_ms <= 220
    assert by_id["untargeted"].finish_reason is FinishReason.LENGTH
    # With the factor at 0 nothing is refused: it waits for the place.
    finished, _ = queued_behind_one_place(factor=0.0)
    assert all(output.finish_reason is FinishReason.LENGTH for output in finished)


def test_server_answers_a_request_refused_in_the_queue_with_429(llama_checkpoint):
    vocab_size = Tokenizer.from_pretrained(llama_checkpoint).vocab_size
    executor = GatedExecutor(vocab_size)
    engine = simulated_engine(
        llama_checkpoint,
        executor,
        scheduling_policy="slo",
        max_num_seqs=1,
        slo_admission_factor=2.0,
    )
    with running_server(engine) as state:
        url = base_url(state)
        results: dict[str, httpx.Response] = {}

        def post(name: str, body: dict) -> threading.Thread:
            def run() -> None:
                results[name] = httpx.post(f"{url}/v1/completions", json=body, timeout=30)

            in_flight = state.engine.num_in_flight
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            wait_for(lambda: state.engine.num_in_flight > in_flight)
            return thread

        # The first holds the batch's one place (its step waits at the gate); the second, due
        # in 20 ms, is accepted behind it and has waited past 40 ms when the gate opens.
        threads = [post("holder", {**completion(None, 10), "stream": False, "max_tokens": 8})]
        threads.append(post("tight", {**completion(20, 10), "stream": False}))
        time.sleep(0.1)
        executor.gate.set()
        for thread in threads:
            thread.join(timeout=30)
    assert results["holder"].status_code == 200
    refused = results["tight"]
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert "2 times its TTFT target of 20 ms" in error["message"]
