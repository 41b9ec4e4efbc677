"""What the front end may use of an engine: the `EngineClient` protocol that the in-process
engine (app/engine/async_engine.py) and the replicas (app/replicas/replicated_engine.py) both
implement, the stream a submitted request answers on, and the refusals `submit` raises."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from baton.core.config import EngineConfig
from baton.core.engine_stats import EngineStats, ReplicaStatus
from baton.core.metrics.metric_aggregates import EngineMetrics
from baton.core.outputs import RequestOutput
from baton.core.request import EngineRequest, Request
from baton.core.request_validator import RequestValidator
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.ttft_forecast import Forecast


class EngineDeadError(RuntimeError):
    pass


class QueueFullError(RuntimeError):
    def __init__(self, retry_after_s: int, limit: int) -> None:
        super().__init__(
            f"the server is at its limit of {limit} requests in flight (--max-num-seqs plus "
            "--max-queued-requests)"
        )
        self.retry_after_s = retry_after_s


class EngineStream:
    """One request's outputs, in order, as its engine delivers them; the last one is finished.
    Closing the stream before that aborts the request: `release(request_id, abort)` tells the
    engine the stream is done with, and whether the request still runs."""

    def __init__(self, request_id: str, release: Callable[[str, bool], None]) -> None:
        self.request_id = request_id
        self._release = release
        self._queue: asyncio.Queue[RequestOutput | Exception] = asyncio.Queue()
        self._finished = False
        self._closed = False

    def put(self, item: RequestOutput | Exception) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._finished or self._closed:
            # Released only now, once the consumer is past the final output: shutdown waits for
            # in-flight streams, and so for their last frames to go out.
            self.close()
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, Exception):
            self.close()
            raise item
        self._finished = item.finished
        return item

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release(self.request_id, not self._finished)

    async def aclose(self) -> None:
        self.close()


@runtime_checkable
class EngineClient(Protocol):
    """The engine as routes, admission, metrics, tracing and shutdown see it, and no more. It
    lives on the event loop that called `start()`; everything it reports is the last published
    snapshot, never the step threads' live state."""

    @property
    def config(self) -> EngineConfig:
        """The engine's settings (the replicas' own, with `--replicas N`)."""
        ...

    @property
    def validator(self) -> RequestValidator:
        """The checks admission runs on every request, once, before `submit`."""
        ...

    @property
    def stats(self) -> EngineStats:
        """The last published snapshot, all replicas' summed into one."""
        ...

    @property
    def healthy(self) -> bool:
        """Whether new requests are served: started, not stopped, not draining."""
        ...

    @property
    def failure(self) -> str:
        """Why the engine is not healthy, for 503 bodies."""
        ...

    @property
    def num_in_flight(self) -> int:
        """Requests submitted whose streams are not released yet."""
        ...

    def clock(self) -> float:
        """The clock arrival times are given on."""
        ...

    def start(self) -> None:
        """Start serving; outputs are delivered onto the running event loop."""
        ...

    def drain(self) -> None:
        """Refuse new requests with 503 from now on; those in flight go on."""
        ...

    def stop(self, timeout: float | None = None) -> None:
        """Cancel what is left and stop serving; blocks up to `timeout`, off the event loop."""
        ...

    def check_capacity(self, num_requests: int = 1) -> None:
        """QueueFullError if `num_requests` more would pass the queue limit, EngineDeadError
        if the engine is not healthy."""
        ...

    def compile_structured_output(self, params: SamplingParams) -> SamplingParams:
        """`params` with its output constraint compiled; slow, so called on a worker thread."""
        ...

    def forecast_ttft(self, num_prompt_tokens: int, ttft_ms: float | None) -> Forecast:
        """When a request arriving now would get its first token, behind those in flight."""
        ...

    def submit(self, requests: list[EngineRequest]) -> list[EngineStream]:
        """Hand validated `requests` to the engine, all or none, and return their streams."""
        ...

    def abort(self, request_id: str) -> None:
        """Cancel a request; its stream still receives a final output."""
        ...

    def abort_all(self) -> None:
        """Cancel every request in flight."""
        ...

    def replica_status(self) -> list[ReplicaStatus]:
        """Each replica as `/v1/stats` and `/metrics` list it (one, for a single engine)."""
        ...

    def attach(self, metrics: EngineMetrics) -> None:
        """Feed `metrics` every step and every finished request; before `start()` only."""
        ...

    def add_finish_listener(self, listener: Callable[[Request, RequestOutput], None]) -> None:
        """Call `listener` with each request as it finishes; before `start()` only."""
        ...
