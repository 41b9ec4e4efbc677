"""`baton simulate --replicas N`: N real engines, each on its own simulated executor and clock,
behind the front end's own `Router` (core/replicas/router.py), on one stream of arrivals. A
discrete-event loop in time order: an arrival is routed on the router's ledgers as they stand then;
a replica's step runs when its clock reaches it, and its outputs and stats snapshot reach the router
only when that step ends, as a server's front end receives them. With `--prefill-replicas P`, the
`DisaggregatingRouter` (core/replicas/disaggregation.py) places each request; a request prefilled
on a prefill replica is handed to a decode replica when its first token reaches the front end,
and starts decoding there once its KV has moved (latency + bytes / bandwidth), when the prefill
replica frees its blocks. With `--migrate auto`, after each replica step the `MigrationPlanner`
(core/replicas/migration.py) may move one of that replica's decodes: the replica hands it off at
its next token and its KV moves the same way.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

from baton.core.engine import Engine
from baton.core.engine_stats import EngineStats
from baton.core.outputs import RequestOutput
from baton.core.prefilled import PrefilledRequest
from baton.core.replicas.disaggregation import DisaggregatingRouter
from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from baton.core.replicas.migration import MigrationPlanner
from baton.core.replicas.replica_ledger import ReplicaLedger
from baton.core.replicas.router import Router, RouteRequest
from baton.core.simulation.records import RequestRecord, record_of, rejected_record
from baton.core.simulation.simulator import (
    SimulationConfig,
    SimulationResult,
    build_engine,
    class_slo,
    prompt_tokens,
    submit,
)
from baton.core.simulation.workloads import WorkloadRequest


@dataclass(slots=True)
class Transfer:
    """One request's KV moved from a prefill replica to a decode replica, or a running
    decode's (`migration`) from one replica to another."""

    request_id: str
    source: int
    target: int
    num_bytes: int
    started_s: float
    seconds: float
    migration: bool = False


@dataclass(slots=True)
class ReplicaSimulationResult(SimulationResult):
    """A simulation's result, with the requests each replica served, in replica order."""

    requests_per_replica: list[int] | None = None
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    # Wall seconds each routing decision took (this machine's, unlike the simulated times):
    # the latency the router adds to a request in the front end.
    route_wall_s: list[float] = field(default_factory=list)
    # Each replica's role, and the KV transfers between them, in the order they started.
    roles: list[str] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)


@dataclass(order=True, slots=True)
class _Event:
    """Due at the front end at `time_s`: a replica step's outputs and snapshot, or the end of
    a KV transfer (`transfer` and its `prefilled` request)."""

    time_s: float
    sequence: int
    replica: int = 0
    outputs: list[RequestOutput] | None = field(default=None, compare=False)
    stats: EngineStats | None = field(default=None, compare=False)
    transfer: Transfer | None = field(default=None, compare=False)
    prefilled: PrefilledRequest | None = field(default=None, compare=False)


class _Replicas:
    """The engines, their executors and the router's side, as the event loop drives them."""

    def __init__(
        self,
        router_name: str,
        policy: str,
        config: SimulationConfig,
        num_replicas: int,
        disaggregation: DisaggregationSettings,
    ) -> None:
        built = [build_engine(policy, config, seed_offset=index) for index in range(num_replicas)]
        self.engines = [engine for engine, _ in built]
        self.executors = [executor for _, executor in built]
        engine_config = self.engines[0].config
        self.ledgers = [
            ReplicaLedger(
                index,
                engine.make_stats(),
                max_num_batched_tokens=engine_config.max_num_batched_tokens,
                max_num_seqs=engine_config.max_num_seqs,
                max_wait_s=engine_config.max_wait_ms / 1000,
                block_size=engine_config.block_size,
                num_kv_blocks=config.num_kv_blocks,
            )
            for index, engine in enumerate(self.engines)
        ]
        factor = engine_config.slo_admission_factor if policy == "slo" else 0.0
        kv_bytes = disaggregation.kv_bytes_per_token
        for engine in self.engines:
            engine.hand_offs.kv_bytes_per_token = kv_bytes
        self.router = DisaggregatingRouter(
            Router(router_name, self.ledgers, factor),
            disaggregation.prefill_replicas,
            disaggregation.disaggregate,
            disaggregation.transfer(),
            kv_bytes,
        )
        self.migration = MigrationPlanner(self.router, disaggregation.migrate)
        self.events: list[_Event] = []
        self.sequence = 0
        self.transfers: list[Transfer] = []
        # What a hand-off needs of each routed request: its workload spec.
        self.specs: dict[str, WorkloadRequest] = {}

    def push(self, event: _Event) -> None:
        self.sequence += 1
        event.sequence = self.sequence
        heapq.heappush(self.events, event)

    def wake(self, replica: int, now: float) -> None:
        """An idle replica's clock stood still since its last step: it wakes at `now`."""
        if not self.engines[replica].has_unfinished_requests:
            clock = self.executors[replica].clock
            clock.now = max(clock.now, now)

    def deliver(self, event: _Event) -> None:
        ledger = self.ledgers[event.replica]
        ledger.publish(event.stats)
        for output in event.outputs:
            ledger.receive(output, event.time_s)
            if output.finished:
                self.migration.finished(output.request_id)
            if output.prefilled is not None:
                ledger.remove(output.request_id)
                self.hand_off(event.replica, output.prefilled, event.time_s)
        move = self.migration.choose(event.replica, event.time_s)
        if move is not None:
            self.migration.asked(move)
            if not self.engines[move.source].migrate(move.request_id):
                self.migration.ended(move.request_id)

    def hand_off(self, source: int, prefilled: PrefilledRequest, now: float) -> None:
        spec = prefilled.request
        target = self.migration.hand_off(
            spec.request_id, prefilled.num_computed_tokens + 1, spec.slo, source, now
        )
        if target is None:
            target = self.router.hand_off(
                spec.request_id,
                prefilled.num_prompt_tokens,
                spec.slo,
                prefilled.block_hashes,
                source,
                now,
            )
        # Decoding on where it was prefilled moves nothing.
        seconds = 0.0 if target == source else self.router.transfer.seconds(prefilled.num_kv_bytes)
        transfer = Transfer(
            spec.request_id,
            source,
            target,
            prefilled.num_kv_bytes,
            now,
            seconds,
            prefilled.migrated,
        )
        self.transfers.append(transfer)
        self.push(_Event(now + seconds, 0, target, transfer=transfer, prefilled=prefilled))

    def land(self, event: _Event) -> None:
        """A transfer ends: the prefill replica frees the blocks, the decode replica decodes."""
        prefilled = event.prefilled
        self.engines[event.transfer.source].release_prefilled(prefilled.request_id)
        self.migration.ended(prefilled.request_id)
        spec = self.specs[prefilled.request_id]
        executor = self.executors[event.replica]
        executor.script_answer(
            prefilled.request_id, spec.output_len if spec.output_len < spec.max_tokens else None
        )
        self.wake(event.replica, event.time_s)
        self.engines[event.replica].add_prefilled(prefilled)


def simulate_replicas(
    router_name: str,
    policy: str,
    workload: list[WorkloadRequest],
    config: SimulationConfig,
    num_replicas: int,
    disaggregation: DisaggregationSettings | None = None,
) -> ReplicaSimulationResult:
    """Serve `workload` on `num_replicas` engines under `policy`, routed by `router_name`. With
    the `slo` policy, arrivals pass the router's SLO admission, as `baton serve` does;
    `disaggregation` sets the replicas' roles (none: every replica prefills and decodes)."""
    if num_replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {num_replicas}")
    replicas = _Replicas(
        router_name, policy, config, num_replicas, disaggregation or DisaggregationSettings()
    )
    engines, executors = replicas.engines, replicas.executors
    records: list[RequestRecord] = []
    route_wall_s: list[float] = []
    class_names: dict[str, str] = {}
    for engine in engines:
        engine.finish_listeners.append(
            lambda request, _: records.append(record_of(request, class_names[request.request_id]))
        )
    specs = sorted(enumerate(workload), key=lambda item: item[1].arrival_s)
    next_arrival = 0
    while next_arrival < len(specs) or replicas.events or any(_busy(e) for e in engines):
        arrival_s = specs[next_arrival][1].arrival_s if next_arrival < len(specs) else math.inf
        event_s = replicas.events[0].time_s if replicas.events else math.inf
        busy = [i for i, engine in enumerate(engines) if _busy(engine)]
        step_s, stepper = min(((executors[i].clock.now, i) for i in busy), default=(math.inf, -1))
        # Arrivals first on a tie: a request arriving as a step ends is judged on the ledger
        # before that step, as the single-engine simulator does.
        if arrival_s <= event_s and arrival_s <= step_s:
            index, spec = specs[next_arrival]
            next_arrival += 1
            class_names[f"sim-{index}"] = spec.request_class.name
            _arrive(replicas, index, spec, config, records, route_wall_s)
        elif event_s <= step_s:
            event = heapq.heappop(replicas.events)
            if event.transfer is None:
                replicas.deliver(event)
            else:
                replicas.land(event)
        else:
            engine = engines[stepper]
            num_steps = engine.num_steps
            outputs = engine.step()
            if engine.num_steps == num_steps and _busy(engine):
                if min(arrival_s, event_s) == math.inf:
                    raise RuntimeError(
                        "a replica's scheduler stalled with requests left; is the cache too small?"
                    )
                # Nothing to run until something arrives: its clock waits for it.
                executors[stepper].clock.now = max(step_s, min(arrival_s, event_s))
            now = executors[stepper].clock.now
            replicas.push(_Event(now, 0, stepper, outputs, engine.make_stats()))
    return ReplicaSimulationResult(
        router_name,
        records,
        sum(engine.num_steps for engine in engines),
        sum(engine.scheduler.num_preemptions for engine in engines),
        _mean(engine.step_cost_model.mean_abs_error_ratio for engine in engines),
        _mean(engine.length_predictor.mean_abs_error_ratio for engine in engines),
        requests_per_replica=[ledger.num_routed for ledger in replicas.ledgers],
        prefix_cache_hits=sum(engine.scheduler.prefix_cache_hits for engine in engines),
        prefix_cache_queries=sum(engine.scheduler.prefix_cache_queries for engine in engines),
        route_wall_s=route_wall_s,
        roles=[role.value for role in replicas.router.roles],
        transfers=replicas.transfers,
    )


def _arrive(
    replicas: _Replicas,
    index: int,
    spec: WorkloadRequest,
    config: SimulationConfig,
    records: list[RequestRecord],
    route_wall_s: list[float],
) -> None:
    """Route one arrival and hand it to its replica, or record its refusal; time the routing
    (hashing the prompt's blocks included) into `route_wall_s`."""
    request_id = f"sim-{index}"
    slo = class_slo(spec.request_class, config.slo_scale)
    now = spec.arrival_s
    prompt = prompt_tokens(index, spec)
    started = time.perf_counter()
    request = RouteRequest.of(request_id, prompt, slo, replicas.engines[0].config.block_size)
    placement = replicas.router.route(request, now)
    route_wall_s.append(time.perf_counter() - started)
    if placement.replica_id is None:
        records.append(rejected_record(request_id, spec.request_class.name, now, now, slo))
        return
    replicas.specs[request_id] = spec
    replicas.wake(placement.replica_id, now)
    engine, executor = (
        replicas.engines[placement.replica_id],
        replicas.executors[placement.replica_id],
    )
    submit(engine, executor, request_id, index, spec, slo, hand_off=placement.split)


def _busy(engine: Engine) -> bool:
    return engine.has_unfinished_requests


def _mean(values) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None
