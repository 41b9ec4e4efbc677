"""`baton simulate --replicas N`: N real engines, each on its own simulated executor and clock,
behind the front end's own `Router` (core/replicas/router.py), on one stream of arrivals. A
discrete- event loop in time order: an arrival is routed on the router's ledgers as they stand then;
a replica's step runs when its clock reaches it, and its outputs and stats snapshot reach the router
only when that step ends, as a server's front end receives them.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

from baton.core.engine import Engine
from baton.core.engine_stats import EngineStats
from baton.core.outputs import RequestOutput
from baton.core.replicas.replica_ledger import ReplicaLedger
from baton.core.replicas.router import Router, RouteRequest
from baton.core.simulation.records import RequestRecord, record_of, rejected_record
from baton.core.simulation.simulated_executor import SimulatedExecutor
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
class ReplicaSimulationResult(SimulationResult):
    """A simulation's result, with the requests each replica served, in replica order."""

    requests_per_replica: list[int] | None = None
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    # Wall seconds each routing decision took (this machine's, unlike the simulated times):
    # the latency the router adds to a request in the front end.
    route_wall_s: list[float] = field(default_factory=list)


@dataclass(order=True, slots=True)
class _Delivery:
    """A replica step's outputs and snapshot, due at the front end when the step ends."""

    time_s: float
    sequence: int
    replica: int = 0
    outputs: list[RequestOutput] | None = None
    stats: EngineStats | None = None


def simulate_replicas(
    router_name: str,
    policy: str,
    workload: list[WorkloadRequest],
    config: SimulationConfig,
    num_replicas: int,
) -> ReplicaSimulationResult:
    """Serve `workload` on `num_replicas` engines under `policy`, routed by `router_name`. With
    the `slo` policy, arrivals pass the router's SLO admission, as `baton serve` does."""
    if num_replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {num_replicas}")
    built = [build_engine(policy, config, seed_offset=index) for index in range(num_replicas)]
    engines = [engine for engine, _ in built]
    executors = [executor for _, executor in built]
    engine_config = engines[0].config
    ledgers = [
        ReplicaLedger(
            index,
            engine.make_stats(),
            max_num_batched_tokens=engine_config.max_num_batched_tokens,
            max_num_seqs=engine_config.max_num_seqs,
            max_wait_s=engine_config.max_wait_ms / 1000,
            block_size=engine_config.block_size,
            num_kv_blocks=config.num_kv_blocks,
        )
        for index, engine in enumerate(engines)
    ]
    factor = engine_config.slo_admission_factor if policy == "slo" else 0.0
    router = Router(router_name, ledgers, factor)
    records: list[RequestRecord] = []
    route_wall_s: list[float] = []
    class_names: dict[str, str] = {}
    for engine in engines:
        engine.finish_listeners.append(
            lambda request, _: records.append(record_of(request, class_names[request.request_id]))
        )
    specs = sorted(enumerate(workload), key=lambda item: item[1].arrival_s)
    deliveries: list[_Delivery] = []
    next_arrival = 0
    sequence = 0
    while next_arrival < len(specs) or deliveries or any(_busy(e) for e in engines):
        arrival_s = specs[next_arrival][1].arrival_s if next_arrival < len(specs) else math.inf
        delivery_s = deliveries[0].time_s if deliveries else math.inf
        busy = [i for i, engine in enumerate(engines) if _busy(engine)]
        step_s, stepper = min(((executors[i].clock.now, i) for i in busy), default=(math.inf, -1))
        # Arrivals first on a tie: a request arriving as a step ends is judged on the ledger
        # before that step, as the single-engine simulator does.
        if arrival_s <= delivery_s and arrival_s <= step_s:
            index, spec = specs[next_arrival]
            next_arrival += 1
            class_names[f"sim-{index}"] = spec.request_class.name
            _arrive(router, engines, executors, index, spec, config, records, route_wall_s)
        elif delivery_s <= step_s:
            delivery = heapq.heappop(deliveries)
            ledger = ledgers[delivery.replica]
            ledger.publish(delivery.stats)
            for output in delivery.outputs:
                ledger.receive(output, delivery.time_s)
        else:
            engine = engines[stepper]
            num_steps = engine.num_steps
            outputs = engine.step()
            if engine.num_steps == num_steps and _busy(engine):
                if next_arrival >= len(specs):
                    raise RuntimeError(
                        "a replica's scheduler stalled with requests left; is the cache too small?"
                    )
                # Nothing to run until something arrives: its clock waits for the next arrival.
                executors[stepper].clock.now = max(step_s, arrival_s)
            sequence += 1
            heapq.heappush(
                deliveries,
                _Delivery(
                    executors[stepper].clock.now, sequence, stepper, outputs, engine.make_stats()
                ),
            )
    return ReplicaSimulationResult(
        router_name,
        records,
        sum(engine.num_steps for engine in engines),
        sum(engine.scheduler.num_preemptions for engine in engines),
        _mean(engine.step_cost_model.mean_abs_error_ratio for engine in engines),
        _mean(engine.length_predictor.mean_abs_error_ratio for engine in engines),
        requests_per_replica=[ledger.num_routed for ledger in ledgers],
        prefix_cache_hits=sum(engine.scheduler.prefix_cache_hits for engine in engines),
        prefix_cache_queries=sum(engine.scheduler.prefix_cache_queries for engine in engines),
        route_wall_s=route_wall_s,
    )


def _arrive(
    router: Router,
    engines: list[Engine],
    executors: list[SimulatedExecutor],
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
    request = RouteRequest.of(request_id, prompt, slo, engines[0].config.block_size)
    route = router.route(request, now)
    route_wall_s.append(time.perf_counter() - started)
    if route.replica_id is None:
        records.append(rejected_record(request_id, spec.request_class.name, now, now, slo))
        return
    engine, executor = engines[route.replica_id], executors[route.replica_id]
    if not _busy(engine):
        # An idle replica's clock stood still since its last step: it wakes at the arrival.
        executor.clock.now = max(executor.clock.now, now)
    submit(engine, executor, request_id, index, spec, slo)


def _busy(engine: Engine) -> bool:
    return engine.has_unfinished_requests


def _mean(values) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None
