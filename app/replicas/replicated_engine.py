"""The front end's engine over N replica actors (`baton serve --replicas N`): an `EngineClient`
(app/engine/client.py), with each request routed by core/replicas/router.py on the replicas'
ledgers (with `--prefill-replicas`, placed by core/replicas/disaggregation.py) and one task per
replica reading its per-step messages. Requests in flight are recorded in
app/replicas/request_table.py; moves between replicas (a split request at its first token, a
live migration with `--migrate auto`) are app/replicas/replica_moves.py's, and a dead or hung
replica's requests, failed cleanly or retried elsewhere while Ray restarts it,
app/replicas/replica_recovery.py's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

import ray
from ray.exceptions import RayActorError, RayError

from baton.app.engine.client import EngineDeadError, EngineStream, QueueFullError
from baton.app.replicas.kv_handoff import KVHandOffs
from baton.app.replicas.ray_replica import ReplicaInfo, ReplicaStep
from baton.app.replicas.replica_moves import ReplicaMoves
from baton.app.replicas.replica_recovery import ReplicaRecovery
from baton.app.replicas.replica_views import combined_stats, new_ledger, replica_statuses
from baton.app.replicas.request_table import RequestTable
from baton.core.config import EngineConfig
from baton.core.engine import INTERNAL_ERROR
from baton.core.engine_stats import EngineStats, ReplicaStatus
from baton.core.metrics.metric_aggregates import EngineMetrics
from baton.core.outputs import RequestOutput
from baton.core.replicas.disaggregation import DisaggregatingRouter
from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from baton.core.replicas.migration import MigrationPlanner
from baton.core.replicas.replica_ledger import ReplicaLedger
from baton.core.replicas.router import NoReplicaError, Router, RouteRequest
from baton.core.request import SLO, EngineRequest, Request
from baton.core.request_validator import RequestValidator
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from baton.core.scheduling.ttft_forecast import Forecast
from baton.core.step_stats import StepStats

logger = logging.getLogger("baton.replicas")


class ReplicatedEngine:
    """Lives on the event loop that calls `start()`; `actors[i]` is replica i."""

    def __init__(
        self,
        actors: Sequence[ray.actor.ActorHandle],
        infos: Sequence[ReplicaInfo],
        config: EngineConfig,
        router: str,
        max_queued_requests: int,
        validator: RequestValidator,
        *,
        stall_timeout_s: float = 60.0,
        disaggregation: DisaggregationSettings | None = None,
    ) -> None:
        self.actors = list(actors)
        self.infos = list(infos)
        self._config = config
        self._validator = validator
        self.max_queued_requests = max_queued_requests
        self.stall_timeout_s = stall_timeout_s
        factor = config.slo_admission_factor if config.scheduling_policy == "slo" else 0.0
        apart = disaggregation or DisaggregationSettings()
        self.placement = DisaggregatingRouter(
            Router(router, [new_ledger(config, i, info) for i, info in enumerate(infos)], factor),
            apart.prefill_replicas,
            apart.disaggregate,
            apart.transfer(),
            infos[0].kv_bytes_per_token,
        )
        self.hand_offs = KVHandOffs(self.actors, apart.transfer())
        self.migration = MigrationPlanner(self.placement, apart.migrate)
        self.requests = RequestTable()
        self.moves = ReplicaMoves(
            self.requests,
            self.placement,
            self.migration,
            self.hand_offs,
            self._fail,
            stall_timeout_s,
        )
        self.recovery = ReplicaRecovery(
            self.actors,
            self.infos,
            config,
            self.placement,
            self.requests,
            self.migration,
            self._send,
            lambda: self._stopped,
        )
        self.step_listeners: list[Callable[[StepStats], None]] = []
        self.finish_listeners: list[Callable[[Request, RequestOutput], None]] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._stopped = False
        self._tasks: list[asyncio.Task] = []

    @property
    def router(self) -> Router:
        return self.placement.router

    @router.setter
    def router(self, router: Router) -> None:
        self.placement.router = router

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def validator(self) -> RequestValidator:
        return self._validator

    @property
    def ledgers(self) -> list[ReplicaLedger]:
        return self.router.replicas

    def clock(self) -> float:
        return time.monotonic()

    @property
    def stats(self) -> EngineStats:
        return combined_stats(self.ledgers)

    def replica_status(self) -> list[ReplicaStatus]:
        return replica_statuses(
            self.ledgers, self.infos, self.placement.roles, self.hand_offs.totals
        )

    def attach(self, metrics: EngineMetrics) -> None:
        """Let `metrics` subscribe to every replica's steps and finishes, which the front end
        replays on the event loop as their messages arrive."""
        metrics.attach(self)

    def add_finish_listener(self, listener: Callable[[Request, RequestOutput], None]) -> None:
        self.finish_listeners.append(listener)

    @property
    def healthy(self) -> bool:
        return not self._stopped and not self._draining and any(r.healthy for r in self.ledgers)

    @property
    def failure(self) -> str:
        if self._draining:
            return "the server is shutting down"
        if self._stopped:
            return "the engine has shut down"
        return "no engine replica is serving; they are restarting"

    @property
    def num_in_flight(self) -> int:
        return len(self.requests.streams)

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._tasks = [
            self.loop.create_task(self._follow(i), name=f"reading replica {i}'s steps")
            for i in range(len(self.actors))
        ]
        self._tasks.append(
            self.loop.create_task(
                self.recovery.watch(self.stall_timeout_s, self.moves.moving),
                name="watching for stalls",
            )
        )
        for task in self._tasks:
            task.add_done_callback(_log_failure)

    def drain(self) -> None:
        self._draining = True

    def stop(self, timeout: float | None = None) -> None:
        """Stop every replica (blocks up to `timeout`); called off the event loop."""
        self._stopped = True
        try:
            ray.get([actor.stop.remote() for actor in self.actors], timeout=timeout)
        except RayError:
            logger.warning("a replica did not stop cleanly", exc_info=True)
        loop = self.loop
        if loop is not None and not loop.is_closed():
            for task in self._tasks:
                loop.call_soon_threadsafe(task.cancel)

    def check_capacity(self, num_requests: int = 1) -> None:
        if not self.healthy:
            raise EngineDeadError(self.failure)
        limit = len(self.actors) * self._config.max_num_seqs + self.max_queued_requests
        if len(self.requests.streams) + num_requests > limit:
            raise QueueFullError(1, limit)

    def compile_structured_output(self, params: SamplingParams) -> SamplingParams:
        if params.structured_output is None:
            return params
        raise InvalidRequestError(
            f"{params.structured_output.param} asks for structured output, which Baton does "
            "not serve with --replicas > 1 yet; leave it out or serve one replica",
            params.structured_output.param,
        )

    def forecast_ttft(self, num_prompt_tokens: int, ttft_ms: float | None) -> Forecast:
        """The best replica's forecast as the router weighs it: a refusing one only when no
        replica can make the target (under `--router slo`)."""
        probe = RouteRequest("", num_prompt_tokens, SLO(ttft_ms=ttft_ms), ())
        try:
            return self.router.choose(probe, time.monotonic()).forecast
        except NoReplicaError as error:
            raise EngineDeadError(str(error)) from None

    def submit(self, requests: list[EngineRequest]) -> list[EngineStream]:
        """Route `requests`, all or none registered, and return their output streams."""
        self.check_capacity(len(requests))
        for request in requests:
            if request.request_id in self.requests.streams:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
        streams = []
        try:
            for request in requests:
                stream = EngineStream(request.request_id, self._release)
                self.requests.streams[request.request_id] = stream
                streams.append(stream)
                self._send(request)
        except BaseException:
            # A request that cannot be placed takes the others of its call back with it: a
            # stream left registered would hold a place in the queue limit for ever.
            for stream in streams:
                self._release(stream.request_id, abort=True)
            raise
        return streams

    def abort(self, request_id: str) -> None:
        replica = self.requests.replica_of.get(request_id)
        if replica is not None:
            self.actors[replica].abort.remote(request_id)

    def abort_all(self) -> None:
        for request_id in list(self.requests.streams):
            self.abort(request_id)

    def _send(self, request: EngineRequest) -> None:
        """Place one request (admission has judged it already) and hand it to its replica:
        split (prefilled there, decoded elsewhere) or whole. One that no split can take now
        (its prefill replicas down, or none predicted to keep its targets) runs whole on any
        replica, as it would without roles."""
        now = time.monotonic()
        route = RouteRequest.of(
            request.request_id, request.prompt_token_ids, request.slo, self._block_size
        )
        replica, split = None, False
        if self.placement.mode != "never":
            with contextlib.suppress(NoReplicaError):
                placement = self.placement.route(route, now)
                replica, split = placement.replica_id, placement.split
        if replica is None:
            replica = self.router.route(route, now, admit=False).replica_id
        assert replica is not None
        self.requests.replica_of[request.request_id] = replica
        self.requests.unanswered[request.request_id] = request
        if request.trace_context is not None:
            self.requests.trace_contexts[request.request_id] = request.trace_context
        untraced = dataclasses.replace(request, trace_context=None)
        self.actors[replica].submit.remote(untraced, split)

    @property
    def _block_size(self) -> int:
        return self.infos[0].limits.block_size

    def _release(self, request_id: str, abort: bool) -> None:
        """A stream is done with: forget it and, if it had not finished, abort its request."""
        if self.requests.streams.pop(request_id, None) is None:
            return
        self.requests.unanswered.pop(request_id, None)
        self.hand_offs.finished(request_id)
        self.migration.finished(request_id)
        replica = self.requests.replica_of.pop(request_id, None)
        if replica is None:
            return
        self.ledgers[replica].remove(request_id)
        if abort:
            self.actors[replica].abort.remote(request_id)

    async def _follow(self, replica: int) -> None:
        """Read replica `replica`'s steps for as long as the server runs; when it dies, fail
        or move its requests and wait for Ray to bring it back."""
        while not self._stopped:
            try:
                stream = self.actors[replica].steps.options(num_returns="streaming").remote()
                async for ref in stream:
                    self._dispatch(replica, await ref)
            except RayError as error:
                if self._stopped:
                    return
                logger.error("engine replica %d failed: %s", replica, error)
                if not isinstance(error, RayActorError):
                    # Its step thread died but the actor lives: Ray restarts what it kills.
                    ray.kill(self.actors[replica], no_restart=False)
                self.recovery.lost(replica)
                await self.recovery.rejoin(replica)

    def _dispatch(self, replica: int, step: ReplicaStep) -> None:
        ledger = self.ledgers[replica]
        now = time.monotonic()
        ledger.publish(step.stats)
        ledger.progressed(now)
        for stats in step.steps:
            for listener in self.step_listeners:
                listener(stats)
        for output in step.outputs:
            try:
                self._take(replica, output, step.kv.get(output.request_id), now)
            except Exception:
                # A bug in handling one request's output ends that request alone: the reader
                # of this replica's steps goes on, or every request on it would hang.
                logger.exception("request %s's output could not be handled", output.request_id)
                self._fail(output.request_id, INTERNAL_ERROR)
        for request, output in step.finished:
            context = self.requests.trace_contexts.pop(request.request_id, None)
            record, migration = self.hand_offs.finished(request.request_id)
            if (record or migration) is not None and context is not None:
                context = dataclasses.replace(context, hand_off=record, migration=migration)
            request.trace_context = context
            for listener in self.finish_listeners:
                listener(request, output)
        try:
            self.moves.after_step(replica, now)
        except Exception:
            # As above: a bug in planning a move must not stop the reading of steps.
            logger.exception("choosing a live migration off replica %d failed", replica)

    def _take(
        self, replica: int, output: RequestOutput, kv: ray.ObjectRef | None, now: float
    ) -> None:
        """One request's output from replica `replica`'s step: to its stream, and a prefilled
        request on to its decode replica."""
        if self.requests.replica_of.get(output.request_id) != replica:
            # Moved away, released, or given up on while its KV moved here: stop it here.
            if not output.finished:
                self.actors[replica].abort.remote(output.request_id)
            return
        self.ledgers[replica].receive(output, now)
        if output.new_token_ids or output.finished:
            self.requests.unanswered.pop(output.request_id, None)
        if output.finished:
            self.requests.replica_of.pop(output.request_id, None)
            self.migration.finished(output.request_id)
        stream = self.requests.streams.get(output.request_id)
        if stream is not None:
            stream.put(output)
        if output.prefilled is not None:
            self.moves.hand_off(replica, output.prefilled, kv, now)

    def _fail(self, request_id: str, message: str) -> None:
        """End a request with `message` and stop it on the replica that has it."""
        replica = self.requests.replica_of.pop(request_id, None)
        self.requests.unanswered.pop(request_id, None)
        if replica is not None:
            self.ledgers[replica].remove(request_id)
            self.actors[replica].abort.remote(request_id)
        self.requests.end_with_error(request_id, message)


def _log_failure(task: asyncio.Task) -> None:
    """A task the front end keeps for the server's life ended with an error: said at once, not
    when the task is collected (never, as the engine holds it)."""
    if not task.cancelled() and task.exception() is not None:
        logger.error("the front end stopped %s", task.get_name(), exc_info=task.exception())
