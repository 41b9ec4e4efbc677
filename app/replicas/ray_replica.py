"""One engine replica as a Ray actor (`baton serve --replicas N`): the engine on its own step
thread, exactly as in a single-process server, and one message per step back to the front end
(every request's new tokens of that step, the stats snapshot, the step's record, the requests
that finished, and the KV of those handed off to a decode replica, in Ray's object store)
through a Ray streaming generator. Imported only when serving with replicas: Ray is an optional
extra (`pip install baton[ray]`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import ray

from baton.app.replicas.replica_settings import ReplicaModel
from baton.core.engine_stats import EngineStats
from baton.core.outputs import RequestOutput
from baton.core.prefilled import PrefilledRequest
from baton.core.request import EngineRequest, Request
from baton.core.request_validator import ModelLimits
from baton.core.step_loop import StepLoop
from baton.core.step_stats import StepStats

logger = logging.getLogger("baton.replicas")


@dataclass(slots=True)
class ReplicaStep:
    """One step of a replica as the front end receives it: the outputs of every request that
    step touched, the snapshot after it, the step's timing (none for an iteration that only
    took adds or aborts) and each finished request with its final output, for the metrics."""

    outputs: list[RequestOutput]
    stats: EngineStats
    steps: list[StepStats]
    finished: list[tuple[Request, RequestOutput]]
    # The prompt KV of each request handed off this step, in Ray's object store (None: it could
    # not be read).
    kv: dict[str, ray.ObjectRef | None]


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """What the front end needs of a replica once, at start and after a restart."""

    node: str
    pid: int
    limits: ModelLimits
    stats: EngineStats
    # Bytes of KV one token holds in its cache: a prefilled request's transfer size.
    kv_bytes_per_token: int = 0


class _Died:
    """Queue marker: the step thread died; the stream ends with an error."""


class EngineReplica:
    """The actor's class; `app/replicas.py` wraps it with `ray.remote` and its resources. Its
    methods run on the actor's thread pool: `steps` blocks on the step queue while `submit`
    and `abort` go to the step thread's inbox, so it needs a concurrency of two or more."""

    def __init__(self, replica_id: int, spec: ReplicaModel) -> None:
        self.replica_id = replica_id
        self.engine = spec.build_engine()
        self._queue: queue.SimpleQueue[ReplicaStep | _Died] = queue.SimpleQueue()
        # Filled by the engine's listeners on the step thread, emptied by each delivery there.
        self._steps: list[StepStats] = []
        self._finished: list[tuple[Request, RequestOutput]] = []
        self.engine.step_listeners.append(self._steps.append)
        self.engine.finish_listeners.append(lambda r, o: self._finished.append((r, o)))
        self._loop = StepLoop(self.engine, self._deliver, self._on_death)
        self._loop.start()

    def info(self) -> ReplicaInfo:
        engine = self.engine
        return ReplicaInfo(
            socket.gethostname(),
            os.getpid(),
            engine.limits,
            engine.make_stats(),
            engine.hand_offs.kv_bytes_per_token,
        )

    def submit(self, request: EngineRequest, hand_off: bool = False) -> None:
        """Queue `request`; with `hand_off`, to its first token only: that output carries the
        `PrefilledRequest` another replica decodes it from."""
        self._loop.submit(request, hand_off=hand_off)

    def add_prefilled(self, prefilled: PrefilledRequest, kv: object) -> int:
        """Decode a request a prefill replica handed off, from its KV (Ray resolves the object
        reference the front end passed before this runs); returns the bytes written."""
        self._loop.call(lambda engine: engine.add_prefilled(prefilled, kv)).result()
        return int(getattr(kv, "nbytes", 0))

    def migrate(self, request_id: str) -> bool:
        """Hand `request_id` off at its next token for a live migration: that step's message
        carries it and its KV as a prefilled request's. False when it cannot move here
        (`Engine.migrate`: not here, or finished)."""
        return bool(self._loop.call(lambda engine: engine.migrate(request_id)).result())

    def abort(self, request_id: str) -> None:
        self._loop.abort(request_id)

    def steps(self) -> Iterator[ReplicaStep]:
        """The replica's steps, one message each, for as long as it lives (a streaming
        generator: the front end reads it with `async for`)."""
        while True:
            item = self._queue.get()
            if isinstance(item, _Died):
                raise RuntimeError(f"engine replica {self.replica_id}'s step thread died")
            yield item

    def stop(self) -> None:
        self._loop.stop(5.0)

    def _deliver(self, outputs: list[RequestOutput], stats: EngineStats) -> None:
        kv = {o.request_id: self._put_kv(o.request_id) for o in outputs if o.prefilled}
        if kv:
            stats = self.engine.make_stats()  # without the blocks just freed
        steps = list(self._steps)
        self._steps.clear()
        finished = [_shippable(request, output) for request, output in self._finished]
        self._finished.clear()
        self._queue.put(ReplicaStep(outputs, stats, steps, finished, kv))

    def _put_kv(self, request_id: str) -> ray.ObjectRef | None:
        """A request handed off this step: its prompt's KV copied into Ray's object store, the
        transfer's source from now on, and its blocks here freed at once (on the step thread,
        between steps, so no later step waits for the transfer)."""
        try:
            return ray.put(self.engine.read_prefilled_kv(request_id))
        except Exception:
            logger.exception("could not read request %s's KV for its transfer", request_id)
            return None
        finally:
            self.engine.release_prefilled(request_id)

    def _on_death(self, error: BaseException) -> None:
        self._queue.put(_Died())


def _shippable(request: Request, output: RequestOutput) -> tuple[Request, RequestOutput]:
    """A finished request with what cannot cross processes (a compiled grammar) or need not
    (its block hashes) left behind."""
    request.block_hashes = []
    params = request.sampling_params
    if params.structured_output is not None:
        request.sampling_params = dataclasses.replace(params, structured_output=None)
    return request, output
