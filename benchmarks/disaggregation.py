"""Prefill and decode apart (issue 46): goodput, the requests per second that meet both their
TTFT and TPOT targets, at tight TPOT targets, for three layouts of the same N replicas in the
replica simulator (core/simulation/replica_simulator.py): co-located (`--disaggregate never`,
every replica prefills and decodes), disaggregated (`always`: P replicas prefill, the others
decode, every request's KV moves) and Baton's per-request choice (`auto`, the same roles);
`--layouts` adds `co-located+migrate` and `auto+migrate`, the same with `--migrate auto` (live
migration of running decodes); `--num-kv-blocks` shrinks every replica's KV cache until long
answers preempt. Simulated time, so the machine's load changes only the wall time.

    python benchmarks/disaggregation.py --replicas 4,8 --seeds 0,1,2,3,4 --jobs 2

Workloads: `mixed` (70% interactive chat, 30% RAG; the classes' TTFT targets and their TPOT
targets times --tpot-scale) and `azure-conv` (the Azure 2023 conversation trace's first rows,
arrival times compressed to the load, every row given --trace-ttft-ms and --trace-tpot-ms). A
load is a share of N times one engine's saturation (the throughput `fcfs` reaches with the
workload's requests all queued at once). One JSON line per run, then per workload, N and
layout: mean goodput and attainment at each load, and the SLO capacity, the highest load with
at least 90% attainment (refusals count as misses), interpolated between the loads run.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor

from baton.core.config import EngineConfig
from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from baton.core.simulation.records import summarize
from baton.core.simulation.replica_simulator import simulate_replicas
from baton.core.simulation.simulator import SimulationConfig, simulate
from baton.core.simulation.trace import load_trace
from baton.core.simulation.workloads import (
    TraceClass,
    WorkloadRequest,
    cap_max_tokens,
    sample_requests,
)

TRACE = "/work/shared/traces/azure_conv_2023.csv"
TARGET_ATTAINMENT = 0.9
# A backlog this long measures the engine's throughput rather than its last answers' drain.
SATURATION_REQUESTS = 1000
# Each layout: its --disaggregate mode, whether its replicas take roles, and its --migrate.
LAYOUTS = {
    "co-located": ("never", False, "never"),
    "disaggregated": ("always", True, "never"),
    "auto": ("auto", True, "never"),
    "co-located+migrate": ("never", False, "auto"),
    "auto+migrate": ("auto", True, "auto"),
}


@dataclasses.dataclass(frozen=True)
class Point:
    workload: str
    replicas: int
    prefill_replicas: int
    seed: int
    load: float
    layout: str


def _config(args: argparse.Namespace, seed: int) -> SimulationConfig:
    engine = EngineConfig(enable_prefix_caching=False, kv_growth_forecast=args.kv_growth_forecast)
    return SimulationConfig(engine=engine, noise=0.05, seed=seed, num_kv_blocks=args.num_kv_blocks)


def draw(args: argparse.Namespace, workload: str, num_requests: int, seed: int, rate: float):
    """The workload's requests at `rate` per second (infinite: all at once), with its targets."""
    if workload == "mixed":
        requests = sample_requests("mixed", num_requests, rate, seed)
        requests = [
            dataclasses.replace(
                r,
                request_class=dataclasses.replace(
                    r.request_class, tpot_ms=r.request_class.tpot_ms * args.tpot_scale
                ),
            )
            for r in requests
        ]
        return cap_max_tokens(requests, "class")
    # The trace's rows from a seed-dependent offset, so seeds replay different stretches.
    rows = load_trace(TRACE, limit=num_requests * (seed + 1))[num_requests * seed :]
    conv = TraceClass("conv", args.trace_ttft_ms, args.trace_tpot_ms, 0)
    start = rows[0].arrival_s
    span = max(rows[-1].arrival_s - start, 1e-9)
    scale = 0.0 if math.isinf(rate) else (len(rows) - 1) / rate / span
    return [
        WorkloadRequest(
            (r.arrival_s - start) * scale, r.prompt_len, r.output_len, r.max_tokens, conv
        )
        for r in rows
    ]


def saturation(job: tuple[argparse.Namespace, str, int, int]) -> tuple[str, int, float]:
    """One engine's `fcfs` throughput on the seed's requests all queued at once."""
    args, workload, seed, num_requests = job
    backlog = draw(args, workload, num_requests, seed, math.inf)
    config = _config(args, seed)
    unbounded = dataclasses.replace(config.engine, max_wait_ms=math.inf)
    result = simulate("fcfs", backlog, dataclasses.replace(config, engine=unbounded))
    return workload, seed, summarize(result.records)["throughput_rps"]


def run(job: tuple[argparse.Namespace, Point, float]) -> dict:
    args, point, rate = job
    requests = draw(
        args, point.workload, args.requests_per_replica * point.replicas, point.seed, rate
    )
    mode, with_roles, migrate = LAYOUTS[point.layout]
    settings = DisaggregationSettings(
        prefill_replicas=point.prefill_replicas if with_roles else 0,
        disaggregate=mode,
        migrate=migrate,
        kv_transfer_latency_ms=args.kv_transfer_latency_ms,
        kv_transfer_gbps=args.kv_transfer_gbps,
    )
    result = simulate_replicas(
        args.router, "slo", requests, _config(args, point.seed), point.replicas, settings
    )
    summary = summarize(result.records)
    return {
        **dataclasses.asdict(point),
        "rate_rps": rate,
        # Of the offered rate, the requests/s that met both targets: the drain after the last
        # arrival does not dilute it.
        "goodput_rps": rate * summary["slo_attainment"],
        "slo_attainment": summary["slo_attainment"],
        "rejected": summary["rejected"],
        "ttft_p99_ms": summary["ttft_p99_ms"],
        "tpot_p99_ms": summary["tpot_p99_ms"],
        "preemptions": result.num_preemptions,
        "transfers": len(result.transfers),
        "migrations": sum(t.migration for t in result.transfers),
        "transfer_ms_mean": statistics.mean(t.seconds * 1000 for t in result.transfers)
        if result.transfers
        else None,
    }


def capacity(loads: list[float], attainment: list[float]) -> float | None:
    """The highest load with `TARGET_ATTAINMENT`, linear between the loads run; None when the
    lowest misses it; the highest load run when none does."""
    if attainment[0] < TARGET_ATTAINMENT:
        return None
    for (low, a_low), (high, a_high) in itertools.pairwise(zip(loads, attainment, strict=True)):
        if a_high < TARGET_ATTAINMENT:
            return low + (high - low) * (a_low - TARGET_ATTAINMENT) / (a_low - a_high)
    return loads[-1]


def summaries(rows: list[dict]) -> list[dict]:
    out = []
    for workload, replicas, layout in sorted(
        {(r["workload"], r["replicas"], r["layout"]) for r in rows}
    ):
        mine = [
            r
            for r in rows
            if (r["workload"], r["replicas"], r["layout"]) == (workload, replicas, layout)
        ]
        loads = sorted({r["load"] for r in mine})
        goodput = [statistics.mean(r["goodput_rps"] for r in mine if r["load"] == x) for x in loads]
        attained = [
            statistics.mean(r["slo_attainment"] for r in mine if r["load"] == x) for x in loads
        ]
        out.append(
            {
                "summary": True,
                "workload": workload,
                "replicas": replicas,
                "layout": layout,
                "goodput_rps": dict(zip(map(str, loads), goodput, strict=True)),
                "slo_attainment": dict(zip(map(str, loads), attained, strict=True)),
                "capacity_load": capacity(loads, attained),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mixed,azure-conv")
    parser.add_argument("--replicas", default="4,8")
    parser.add_argument(
        "--prefill-share",
        default="mixed=0.25,azure-conv=0.5",
        help="prefill replicas: this share of N, per workload (its prefill's share of the work)",
    )
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--loads", default="0.7,0.9,1.1", help="shares of N x saturation")
    parser.add_argument("--layouts", default="co-located,disaggregated,auto")
    parser.add_argument("--requests-per-replica", type=int, default=150)
    parser.add_argument("--tpot-scale", type=float, default=0.4, help="mixed: TPOT target scale")
    parser.add_argument("--trace-ttft-ms", type=float, default=1500.0)
    parser.add_argument("--trace-tpot-ms", type=float, default=25.0)
    parser.add_argument("--kv-transfer-latency-ms", type=float, default=0.5)
    parser.add_argument("--kv-transfer-gbps", type=float, default=50.0)
    parser.add_argument(
        "--router", default="slo", help="the router placing requests (slo balances by forecast)"
    )
    parser.add_argument(
        "--num-kv-blocks",
        type=int,
        default=SimulationConfig().num_kv_blocks,
        help="KV blocks per replica (fewer: long answers outgrow a replica's cache)",
    )
    parser.add_argument(
        "--kv-growth-forecast",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="admission leaves the running requests room to grow (off: as before it did)",
    )
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    replica_counts = [int(n) for n in args.replicas.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    layouts = args.layouts.split(",")
    shares = {
        name: float(share)
        for name, share in (item.split("=") for item in args.prefill_share.split(","))
    }
    with ProcessPoolExecutor(args.jobs) as pool:
        jobs = [(args, w, s, SATURATION_REQUESTS) for w in workloads for s in seeds]
        one = {(w, s): rps for w, s, rps in pool.map(saturation, jobs)}
        print(json.dumps({"saturation_rps": {f"{w} seed {s}": r for (w, s), r in one.items()}}))
        points = [
            (
                args,
                Point(w, n, max(1, round(shares[w] * n)), s, load, layout),
                load * n * one[w, s],
            )
            for w, n, s, load, layout in itertools.product(
                workloads, replica_counts, seeds, loads, layouts
            )
        ]
        rows = []
        for row in pool.map(run, points):
            rows.append(row)
            print(json.dumps(row), flush=True)
    for summary in summaries(rows):
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
