"""The bridge between the asyncio event loop and the step thread: the in-process `EngineClient`.

Routes `submit()` requests and iterate the streams it returns. Adds and aborts cross into the
step thread through `StepLoop`'s inbox; each step's outputs for all requests come back in one
`call_soon_threadsafe`, and are fanned out to per-request queues on the event loop.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

from baton.app.engine.client import EngineDeadError, EngineStream, QueueFullError
from baton.core.config import EngineConfig
from baton.core.engine import Engine
from baton.core.engine_stats import EngineStats, ReplicaStatus
from baton.core.metrics.metric_aggregates import EngineMetrics
from baton.core.outputs import RequestOutput
from baton.core.request import EngineRequest, Request
from baton.core.request_validator import RequestValidator
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.ttft_forecast import Forecast, TTFTForecast
from baton.core.step_loop import StepLoop

# Retry-After is the time the queue ahead takes to drain at the pace of recent completions.
PACE_WINDOW_S = 30.0
MAX_RETRY_AFTER_S = 60
# The step thread waits at most this long for the event loop to take a step's outputs: a
# stalled loop must not stall the engine for good.
DISPATCH_WAIT_S = 0.5


class AsyncEngine:
    """Owns the step thread; safe to use from the event loop that called `start()`. Implements
    `EngineClient`; `engine` is the engine the step thread owns, which outside this module only
    tests reach into."""

    def __init__(self, engine: Engine, max_queued_requests: int) -> None:
        self.engine = engine
        self.max_queued_requests = max_queued_requests
        # The event loop that called `start()`: outputs are delivered onto it.
        self.loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, EngineStream] = {}
        self._step_loop = StepLoop(engine, self._deliver_from_step_thread, self._on_death)
        # The engine as of the last step the event loop has taken: what metrics, stats and
        # admission read, never the step thread's live queues.
        self._stats: EngineStats = engine.make_stats()
        self._dead: str | None = None
        # Set at shutdown (`drain`): in-flight requests finish, new ones are refused with 503.
        self._draining = False
        self._started_at = time.monotonic()
        # Event-loop times of recent completions; bounded so a busy server keeps only the last.
        self._finish_times: deque[float] = deque(maxlen=1024)
        self._num_submitted = 0
        self._num_finished = 0
        # Set when the event loop has taken the last step's outputs (see the step-thread side).
        self._dispatched = threading.Event()
        self._dispatched.set()
        # Prefill owed by the requests in flight, kept on the event loop for admission control.
        config = engine.config
        self.forecast = TTFTForecast(
            self._stats.step_cost,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            config.max_wait_ms / 1000,
        )

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def validator(self) -> RequestValidator:
        return self.engine.validator

    @property
    def stats(self) -> EngineStats:
        return self._stats

    def clock(self) -> float:
        """The engine's clock, on which arrival times are given."""
        return self.engine.clock()

    def attach(self, metrics: EngineMetrics) -> None:
        """Let `metrics` subscribe to the engine's step and finish listeners, which run on the
        step thread: before `start()` only."""
        self._before_start()
        metrics.attach(self.engine)

    def add_finish_listener(self, listener: Callable[[Request, RequestOutput], None]) -> None:
        """Call `listener` on the step thread as each request finishes: before `start()` only."""
        self._before_start()
        self.engine.finish_listeners.append(listener)

    def _before_start(self) -> None:
        if self._step_loop.is_alive:
            raise RuntimeError("engine listeners must be added before the step thread starts")

    @property
    def healthy(self) -> bool:
        return self._step_loop.is_alive and self._dead is None and not self._draining

    @property
    def failure(self) -> str:
        """Why the engine is not serving, for 503 bodies (health, refused requests)."""
        if self._dead is None and self._draining:
            return "the server is shutting down"
        return self._dead or "the engine is not running"

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._started_at = time.monotonic()
        self._step_loop.start()

    def drain(self) -> None:
        self._draining = True

    def stop(self, timeout: float | None = None) -> None:
        """Cancel what is left and end the step thread (blocks up to `timeout`)."""
        self._step_loop.stop(timeout)
        self._dead = self._dead or "the engine has shut down"

    def replica_status(self) -> list[ReplicaStatus]:
        """This process's one engine, as `--replicas N` lists each of its replicas."""
        return [
            ReplicaStatus(
                0,
                socket.gethostname(),
                os.getpid(),
                self.healthy,
                self._stats,
                len(self._streams),
                self._num_submitted,
                self._num_finished,
            )
        ]

    def check_capacity(self, num_requests: int = 1) -> None:
        """Refuse `num_requests` more past the queue limit, before any work is spent on them."""
        if not self.healthy:
            raise EngineDeadError(self.failure)
        limit = self.engine.config.max_num_seqs + self.max_queued_requests
        if len(self._streams) + num_requests > limit:
            raise QueueFullError(self._retry_after_s(), limit)

    def compile_structured_output(self, params: SamplingParams) -> SamplingParams:
        return self.engine.compile_structured_output(params)

    def forecast_ttft(self, num_prompt_tokens: int, ttft_ms: float | None) -> Forecast:
        """When a request arriving now would get its first token, behind those in flight."""
        return self.forecast.predict(num_prompt_tokens, ttft_ms, time.monotonic())

    def submit(self, requests: list[EngineRequest]) -> list[EngineStream]:
        """Hand `requests` (validated) to the step thread, all or none, and return their output
        streams.

        The capacity check and the registration are one synchronous step on the event loop, so
        concurrent admissions cannot overshoot the queue limit between them. Closing a stream
        before its final output aborts its request.
        """
        self.check_capacity(len(requests))
        for request in requests:
            if request.request_id in self._streams:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
        now = time.monotonic()
        streams = []
        for request in requests:
            stream = EngineStream(request.request_id, self._release)
            self._streams[request.request_id] = stream
            self.forecast.add(request.request_id, len(request.prompt_token_ids), request.slo, now)
            self._step_loop.submit(request)
            self._num_submitted += 1
            streams.append(stream)
        return streams

    def _release(self, request_id: str, abort: bool) -> None:
        """A stream is done with: forget it and, if it had not finished, abort its request."""
        if self._streams.pop(request_id, None) is None:
            return
        self.forecast.remove(request_id)
        if abort:
            self._step_loop.abort(request_id)

    def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self._step_loop.abort(request_id)

    def abort_all(self) -> None:
        """Cancel every in-flight request; each stream still receives its final output."""
        for request_id in list(self._streams):
            self._step_loop.abort(request_id)

    def _on_death(self, error: BaseException) -> None:
        """Runs on the dying step thread: every waiting client gets an error, health fails."""
        # The traceback is in the log (StepLoop); clients and /health get no internals.
        self._dead = "the engine stopped after an internal error; the server log has the details"
        self._call_on_loop(self._fail_all, EngineDeadError(self._dead))

    def _deliver_from_step_thread(self, outputs: list[RequestOutput], stats: EngineStats) -> None:
        # One hop per step, whatever the number of requests and tokens in it. The step thread
        # may run one step ahead of the event loop, no more: it computes step N+1 while the loop
        # sends step N, but never piles steps up in the queues, which would burst tokens to
        # clients and hog the GIL when steps are cheap.
        self._dispatched.wait(DISPATCH_WAIT_S)
        self._dispatched.clear()
        self._call_on_loop(self._dispatch, outputs, stats)

    def _call_on_loop(self, callback, *arguments) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(callback, *arguments)

    def _dispatch(self, outputs: list[RequestOutput], stats: EngineStats) -> None:
        self._stats = stats
        self.forecast.cost_model = stats.step_cost
        self.forecast.lifetime_s = stats.mean_lifetime_s
        now = time.monotonic()
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put(output)
                if output.new_token_ids:
                    self.forecast.first_token(output.request_id, now)
            if output.finished:
                self._finish_times.append(now)
                self._num_finished += 1
        self._dispatched.set()

    def _fail_all(self, error: Exception) -> None:
        for stream in self._streams.values():
            stream.put(error)

    def _retry_after_s(self) -> int:
        """Seconds until the requests queued now have drained, at the recent completion rate.

        The rate is completions over the last PACE_WINDOW_S (or since start). With none in
        that time it is counted as one, an upper bound, so a stalled server asks for long waits.
        """
        now = time.monotonic()
        recent = self._finish_times
        while recent and recent[0] < now - PACE_WINDOW_S:
            recent.popleft()
        if len(recent) == recent.maxlen:
            observed_s = now - recent[0]
        else:
            observed_s = min(PACE_WINDOW_S, now - self._started_at)
        queued = max(1, len(self._streams) - self.engine.config.max_num_seqs)
        drain_s = queued * observed_s / max(1, len(recent))
        return min(MAX_RETRY_AFTER_S, max(1, math.ceil(drain_s)))
