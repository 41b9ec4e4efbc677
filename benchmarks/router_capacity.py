"""What routing buys in capacity (issue 16): each router's SLO attainment at given shares of
the replicas' combined saturation, and its SLO capacity, the highest load with at least 90%
attainment (refusals count as misses), by bisection, as benchmarks/slo_attainment.py does for one
engine. N engines behind the router in the replica simulator (core/simulation/replica_simulator.py),
simulated time, so the machine's load changes the wall time only.

    python benchmarks/router_capacity.py --replicas 4,8 --seeds 0,1,2 --jobs 2

A load is a share of N times one engine's saturation on the seed's draw (the throughput `fcfs`
reaches with every request queued at once, `baton simulate --load`). Every engine runs the `slo`
policy with SLO admission, prefix caching on, `baton simulate`'s defaults otherwise. One JSON
line per run, then one summary line per replica count and router: means over the seeds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from concurrent.futures import ProcessPoolExecutor

from baton.app.commands.simulate import saturation_rps
from baton.core.config import EngineConfig
from baton.core.replicas.router import ROUTERS
from baton.core.simulation.records import summarize
from baton.core.simulation.replica_simulator import simulate_replicas
from baton.core.simulation.simulator import SimulationConfig
from baton.core.simulation.workloads import cap_max_tokens, sample_requests

TARGET_ATTAINMENT = 0.9
# Bisection bounds as shares of saturation: a router's capacity lies between them (the
# saturation is a backlog's FCFS throughput, which a stream of arrivals can exceed a little).
LOW_LOAD, HIGH_LOAD = 0.9, 1.7
BISECTION_STEPS = 5


def config_for(seed: int) -> SimulationConfig:
    """`baton simulate`'s defaults for a shared-prefix workload."""
    return SimulationConfig(engine=EngineConfig(enable_prefix_caching=True), noise=0.05, seed=seed)


def saturation(point: tuple[str, int, int, int]) -> tuple[int, int, float]:
    """N replicas' combined saturation rate on one seed's draw."""
    workload, replicas, seed, num_requests = point
    one = saturation_rps(workload, num_requests, seed, config_for(seed))
    return replicas, seed, replicas * one


def run(point: tuple[str, int, int, str, float, float, int]) -> dict:
    """One router on one draw at `load` times `saturation_rps`."""
    workload_name, replicas, seed, router, load, combined_rps, num_requests = point
    workload = sample_requests(workload_name, num_requests, load * combined_rps, seed)
    result = simulate_replicas(
        router, "slo", cap_max_tokens(workload, "class"), config_for(seed), replicas
    )
    summary = summarize(result.records)
    classes = {
        name: summarize([r for r in result.records if r.class_name == name])["slo_attainment"]
        for name in sorted({r.class_name for r in result.records})
    }
    return {
        "replicas": replicas,
        "seed": seed,
        "router": router,
        "load": load,
        "slo_attainment": summary["slo_attainment"],
        "goodput_rps": summary["goodput_rps"],
        "rejected": summary["rejected"],
        "ttft_p99_ms": summary["ttft_p99_ms"],
        "class_attainment": classes,
        "requests_per_replica": result.requests_per_replica,
        "prefix_cache_hit_rate": result.prefix_cache_hits / max(1, result.prefix_cache_queries),
    }


def capacity(point: tuple[str, int, int, str, float, int]) -> dict:
    """Bisect the load for the highest with `TARGET_ATTAINMENT`."""
    workload_name, replicas, seed, router, combined_rps, num_requests = point
    low, high = LOW_LOAD, HIGH_LOAD
    probes = []
    for _ in range(BISECTION_STEPS):
        load = (low + high) / 2
        row = run((workload_name, replicas, seed, router, load, combined_rps, num_requests))
        probes.append((load, row["slo_attainment"]))
        if row["slo_attainment"] >= TARGET_ATTAINMENT:
            low = load
        else:
            high = load
    return {
        "replicas": replicas,
        "seed": seed,
        "router": router,
        "capacity_load": low,
        "capacity_rps": low * combined_rps,
        "probes": probes,
    }


def summarize_rows(rows: list[dict], capacities: list[dict]) -> list[dict]:
    """Per replica count and router: attainment at each load and capacity, means over seeds."""
    summaries = []
    keys = sorted({(r["replicas"], r["router"]) for r in [*rows, *capacities]})
    for replicas, router in keys:
        mine = [r for r in rows if (r["replicas"], r["router"]) == (replicas, router)]
        caps = [c for c in capacities if (c["replicas"], c["router"]) == (replicas, router)]
        loads = sorted({r["load"] for r in mine})
        summaries.append(
            {
                "summary": True,
                "replicas": replicas,
                "router": router,
                "attainment": {
                    str(load): _mean([r["slo_attainment"] for r in mine if r["load"] == load])
                    for load in loads
                },
                "capacity_load": _mean([c["capacity_load"] for c in caps]),
                "capacity_load_by_seed": [c["capacity_load"] for c in caps],
            }
        )
    return summaries


def _mean(values: list[float]) -> float | None:
    return statistics.mean(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mixed-prefix")
    parser.add_argument("--replicas", default="4,8")
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--loads", default="1.0,1.1", help="shares of combined saturation")
    parser.add_argument("--no-capacity", action="store_true", help="skip the bisection")
    parser.add_argument(
        "--requests-per-replica", type=int, default=250, help="requests drawn: this times N"
    )
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    replica_counts = [int(n) for n in args.replicas.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    routers = args.routers.split(",")
    loads = [float(x) for x in args.loads.split(",")] if args.loads else []
    sizes = {n: n * args.requests_per_replica for n in replica_counts}
    with ProcessPoolExecutor(args.jobs) as pool:
        points = [(args.workload, n, s, sizes[n]) for n in replica_counts for s in seeds]
        rates = {(n, s): rate for n, s, rate in pool.map(saturation, points)}
        print(json.dumps({"saturation_rps": {f"{n}x seed {s}": r for (n, s), r in rates.items()}}))
        runs = [
            (args.workload, n, s, router, load, rates[n, s], sizes[n])
            for n, s, router, load in itertools.product(replica_counts, seeds, routers, loads)
        ]
        rows = []
        for row in pool.map(run, runs):
            rows.append(row)
            print(json.dumps(row), flush=True)
        capacities = []
        if not args.no_capacity:
            bisections = [
                (args.workload, n, s, router, rates[n, s], sizes[n])
                for n, s, router in itertools.product(replica_counts, seeds, routers)
            ]
            for row in pool.map(capacity, bisections):
                capacities.append(row)
                print(json.dumps(row), flush=True)
    for summary in summarize_rows(rows, capacities):
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
