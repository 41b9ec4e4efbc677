"""`baton simulate`: run scheduling policies on the same simulated arrivals, drawn from a
workload or replayed from a trace, and compare their goodput, SLO attainment and latency
(core/simulation/simulator.py does the simulating); with `--replicas N`, N engines behind each
router (core/simulation/replica_simulator.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

from baton.app.commands.calibration import (
    calibrated_coefficients,
    format_cost,
    served_coefficients,
)
from baton.app.commands.load_settings import LoadSettings
from baton.app.commands.progress import each
from baton.app.commands.simulate_report import print_table
from baton.app.commands.simulate_settings import (
    DEFAULT_LOAD,
    DEFAULT_NUM_REQUESTS,
    SimulateSettings,
)
from baton.app.flags import FlagGroup
from baton.app.model_settings import ModelSettings
from baton.app.replicas.replica_settings import ReplicaSettings
from baton.core.config import POLICIES, EngineConfig
from baton.core.metrics.latency import percentile
from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from baton.core.replicas.router import ROUTERS
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.simulation.records import queue_trend, summarize
from baton.core.simulation.replica_simulator import Transfer, simulate_replicas
from baton.core.simulation.simulator import (
    DEFAULT_COST,
    SimulationConfig,
    SimulationResult,
    simulate,
)
from baton.core.simulation.trace import load_trace
from baton.core.simulation.workloads import (
    PREFIX_WORKLOADS,
    LengthStats,
    WorkloadRequest,
    cap_max_tokens,
    sample_requests,
)

SIMULATION = FlagGroup(SimulateSettings, "simulation")
LOAD = FlagGroup(LoadSettings, "load")
REPLICAS = FlagGroup(ReplicaSettings, "replicas", only=("num_replicas",))
DISAGGREGATION = FlagGroup(DisaggregationSettings, "prefill and decode apart")
# The engine settings a simulation models; the KV cache is a fixed size, as no memory is there
# to size it from.
ENGINE = FlagGroup(
    EngineConfig,
    "engine",
    only=(
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "num_kv_blocks",
        "max_wait_ms",
        "max_preemptions",
        "kv_growth_forecast",
        "slo_admission_factor",
        "speculative_method",
        "num_speculative_tokens",
    ),
    defaults={"num_kv_blocks": SimulationConfig().num_kv_blocks},
)
# Where --calibrate runs its model.
DEVICE = FlagGroup(ModelSettings, "calibration", only=("device",))


def add_simulate_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "simulate",
        help="compare scheduling policies in a discrete-event simulation (no model runs)",
        description="Simulate the real scheduler and KV block pool on a step-cost model.",
    )
    for group in (SIMULATION, LOAD, REPLICAS, DISAGGREGATION, ENGINE, DEVICE):
        group.add_to(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = SIMULATION.build(args)
    load = LOAD.build(args)
    num_replicas = REPLICAS.build(args).num_replicas
    disaggregation = DISAGGREGATION.build(args)
    if disaggregation.prefill_replicas and disaggregation.prefill_replicas >= num_replicas:
        raise ValueError(
            f"--prefill-replicas {disaggregation.prefill_replicas} leaves no decode replica of "
            f"--replicas {num_replicas}; give fewer prefill replicas or more replicas"
        )
    default_policies = "slo,fcfs,static" if num_replicas == 1 else "slo"
    policies = _names(settings.policy or default_policies)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"--policy takes a comma-separated list of {', '.join(POLICIES)}")
    if settings.router is not None and num_replicas == 1:
        raise ValueError("--router applies to --replicas > 1: one engine needs no routing")
    routers = _names(settings.router or ",".join(ROUTERS))
    if not routers or any(r not in ROUTERS for r in routers):
        raise ValueError(f"--router takes a comma-separated list of {', '.join(ROUTERS)}")
    if settings.num_requests is not None and settings.num_requests < 1:
        raise ValueError("--num-requests must be >= 1")
    if settings.workload_file and (settings.rate is not None or settings.load is not None):
        raise ValueError(
            "--rate and --load do not apply to --workload-file: the trace sets the arrival "
            "times (--time-scale speeds them up or slows them down)"
        )
    if load.time_scale != 1.0 and not settings.workload_file:
        raise ValueError("--time-scale applies to --workload-file only; use --rate or --load")
    engine = ENGINE.build(
        args,
        # Only shared-prefix workloads share a block between prompts.
        enable_prefix_caching=load.workload in PREFIX_WORKLOADS and not settings.workload_file,
    )
    config = SimulationConfig(
        engine=engine,
        num_kv_blocks=engine.num_kv_blocks,
        cost=_coefficients(settings, load, engine, DEVICE.build(args).device),
        noise=settings.noise,
        seed=load.seed,
        slo_scale=load.slo_scale,
        draft_acceptance=settings.draft_acceptance,
    )
    if not 0.0 <= settings.draft_acceptance <= 1.0:
        raise ValueError(
            f"--draft-acceptance is a probability in [0, 1], got {settings.draft_acceptance}"
        )
    if settings.workload_file:
        workload = load_trace(
            settings.workload_file,
            time_scale=load.time_scale,
            length_scale=load.length_scale,
            limit=settings.num_requests,
        )
        rate = mean_rate(workload)
        # A trace's own rows queued at once say little of saturation: too few to fill the
        # machine for long, they measure mostly the longest answer's drain.
        saturation = None
    else:
        num_requests = settings.num_requests or DEFAULT_NUM_REQUESTS
        saturation = None
        rate = settings.rate
        if rate is None:
            saturation = num_replicas * saturation_rps(
                load.workload,
                num_requests,
                load.seed,
                config,
                load.length_scale,
                settings.max_tokens,
            )
            rate = (DEFAULT_LOAD if settings.load is None else settings.load) * saturation
        workload = sample_requests(
            load.workload, num_requests, rate, load.seed, load.burstiness, load.length_scale
        )
    # Each run by the name its report and progress bar show.
    runs: dict[str, tuple[str, str | None]] = {policy: (policy, None) for policy in policies}
    if num_replicas > 1:
        runs = {
            router if len(policies) == 1 else f"{policy}/{router}": (policy, router)
            for policy in policies
            for router in routers
        }
    # Speculation's effect is the difference it makes: each run also without it, beside it.
    configs = {name: config for name in runs}
    if engine.speculates:
        plain = dataclasses.replace(config, engine=_without_speculation(engine))
        configs = {
            variant: chosen
            for name in runs
            for variant, chosen in ((name, plain), (f"{name}+spec", config))
        }
        runs = {variant: runs[variant.removesuffix("+spec")] for variant in configs}
    workload = cap_max_tokens(workload, settings.max_tokens)
    report = {}
    for name in each(runs, "simulating", "run", quiet=load.json):
        policy, router = runs[name]
        started = time.perf_counter()
        result: SimulationResult
        if router is None:
            result = simulate(policy, workload, configs[name])
        else:
            result = simulate_replicas(
                router, policy, workload, configs[name], num_replicas, disaggregation
            )
        summary = summarize(result.records)
        classes = sorted({r.class_name for r in result.records})
        trend = queue_trend(result.records)
        warning = trend.warning()
        if warning:
            print(f"baton simulate: warning: {name}: {warning}", file=sys.stderr)
        report[name] = {
            **summary,
            "rate_rps": rate,
            "saturation_rps": saturation,
            "num_preemptions": result.num_preemptions,
            "num_steps": result.num_steps,
            "step_cost_model_error_ratio": result.step_cost_error,
            "length_predictor_error_ratio": result.length_error,
            "queue": trend.as_dict(),
            "warning": warning,
            "classes": {
                name: summarize([r for r in result.records if r.class_name == name])
                for name in classes
            },
            "wall_s": time.perf_counter() - started,
        }
        if router is not None:
            report[name].update(
                policy=policy,
                router=router,
                replicas=num_replicas,
                requests_per_replica=result.requests_per_replica,
                prefix_cache_hit_rate=result.prefix_cache_hits
                / max(1, result.prefix_cache_queries),
                route_us_p50=percentile(sorted(result.route_wall_s), 50) * 1e6,
                route_us_p99=percentile(sorted(result.route_wall_s), 99) * 1e6,
                roles=result.roles,
                transfers=transfer_summary(result.transfers),
            )
    if load.json:
        print(json.dumps(report, indent=2))
    else:
        if settings.workload_file:
            source = f"trace {settings.workload_file} (time scale {load.time_scale:g})"
        else:
            source = f"workload {load.workload}, burstiness {load.burstiness}"
        share = f" ({rate / saturation:.0%} of saturation {saturation:.2f}/s)" if saturation else ""
        replicas = f" on {num_replicas} replicas" if num_replicas > 1 else ""
        headline = (
            f"{source}, {len(workload)} requests at {rate:.2f}/s{share}{replicas}, seed "
            f"{load.seed}; cost {format_cost(config.cost)}"
        )
        print_table(report, headline, LengthStats.of(workload), settings.max_tokens)
    return 0


def transfer_summary(transfers: list[Transfer]) -> dict:
    """The KV transfers of a run: how many (of them live migrations), their bytes, and their
    latency in ms."""
    seconds = sorted(transfer.seconds for transfer in transfers)
    return {
        "count": len(transfers),
        "migrations": sum(transfer.migration for transfer in transfers),
        "bytes": sum(transfer.num_bytes for transfer in transfers),
        "latency_ms_p50": percentile(seconds, 50) * 1000 if seconds else None,
        "latency_ms_p99": percentile(seconds, 99) * 1000 if seconds else None,
    }


def _without_speculation(engine: EngineConfig) -> EngineConfig:
    return dataclasses.replace(engine, speculative_method="none")


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def mean_rate(workload: list[WorkloadRequest]) -> float:
    """Arrivals per second over a workload's arrival span (infinite when all arrive at once)."""
    span = workload[-1].arrival_s - workload[0].arrival_s
    return (len(workload) - 1) / span if span > 0 else math.inf


def saturation_rps(
    workload: str,
    num_requests: int,
    seed: int,
    config: SimulationConfig,
    length_scale: float = 1.0,
    max_tokens: str = "class",
) -> float:
    """The throughput FCFS reaches with every request queued at once: the most this machine
    can serve, whatever the order. Without the starvation bound: in a backlog every request
    would pass it, and the preemptions that keep it would measure the bound, not the machine."""
    backlog = sample_requests(workload, num_requests, math.inf, seed, 1.0, length_scale)
    backlog = cap_max_tokens(backlog, max_tokens)
    # The plain machine's saturation: a load's share means the same with speculation or not.
    unbounded = dataclasses.replace(_without_speculation(config.engine), max_wait_ms=math.inf)
    result = simulate("fcfs", backlog, dataclasses.replace(config, engine=unbounded))
    return summarize(result.records)["throughput_rps"]


def _coefficients(
    settings: SimulateSettings, load: LoadSettings, engine: EngineConfig, device: str
) -> CostCoefficients:
    if settings.calibrate:
        config = EngineConfig(
            max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens
        )
        workload = sample_requests(
            load.workload, settings.calibrate_requests, math.inf, load.seed, 1.0, load.length_scale
        )
        fitted = calibrated_coefficients(settings.calibrate, device, config, workload)
    elif settings.calibrate_from:
        fitted = served_coefficients(settings.calibrate_from, load.api_key)
    else:
        return CostCoefficients.parse(settings.cost) if settings.cost else DEFAULT_COST
    print(f"calibrated: {format_cost(fitted)}", file=sys.stderr)
    return fitted
