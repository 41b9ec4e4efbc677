"""SLO attainment of every policy on the same arrivals, over seeds and load points: the table
issue 19's targets are stated in. Simulated time (core/simulation/simulator.py, `baton simulate`'s
defaults), so the machine's load changes the wall time only.

    python benchmarks/slo_attainment.py --loads 0.8,0.9,1.0,1.05 --seeds 0,1,2,3,4 --jobs 2

A load is a share of the seed's saturation rate: the throughput `fcfs` reaches with every
request queued at once (`baton simulate --load`). One JSON line per run. With `--capacity`,
each policy's SLO capacity instead: the highest load with at least 90% attainment, by
bisection, beside the perfect-shedding bound 1 / 0.9 (no policy serves more than saturation
in the long run, so at best it refuses the surplus and meets every SLO it serves).
"""

from __future__ import annotations

import argparse
import itertools
import json
from concurrent.futures import ProcessPoolExecutor

from baton.app.commands.simulate import saturation_rps
from baton.core.config import EngineConfig
from baton.core.simulation.records import summarize
from baton.core.simulation.simulator import SimulationConfig, simulate
from baton.core.simulation.workloads import sample_requests

BASELINES = "slo,sjf,fcfs,hrrn,ltr,priority"
TARGET_ATTAINMENT = 0.9
BISECTION_STEPS = 6


def config_for(seed: int) -> SimulationConfig:
    """`baton simulate`'s defaults."""
    return SimulationConfig(engine=EngineConfig(enable_prefix_caching=False), noise=0.05, seed=seed)


def saturation(point: tuple[str, int, int]) -> float:
    workload_name, seed, num_requests = point
    return saturation_rps(workload_name, num_requests, seed, config_for(seed))


def run(point: tuple[str, float, float, int, str, int]) -> dict:
    workload_name, rate, burstiness, seed, policy, num_requests = point
    workload = sample_requests(workload_name, num_requests, rate, seed, burstiness)
    config = config_for(seed)
    result = simulate(policy, workload, config)
    summary = summarize(result.records)
    classes = {}
    for name in sorted({r.class_name for r in result.records}):
        part = summarize([r for r in result.records if r.class_name == name])
        classes[name] = {
            "slo_attainment": part["slo_attainment"],
            "ttft_p99_ms": part["ttft_p99_ms"],
        }
    return {
        "workload": workload_name,
        "rate": rate,
        "burstiness": burstiness,
        "seed": seed,
        "policy": policy,
        "slo_attainment": summary["slo_attainment"],
        "rejected": summary["rejected"],
        "ttft_p99_ms": summary["ttft_p99_ms"],
        "max_wait_ms": summary["max_wait_ms"],
        "num_preemptions": result.num_preemptions,
        "classes": classes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mixed")
    rates = parser.add_mutually_exclusive_group(required=True)
    rates.add_argument("--rates", help="comma-separated requests per second")
    rates.add_argument("--loads", help="comma-separated shares of saturation")
    rates.add_argument("--capacity", action="store_true", help="bisect each policy's capacity")
    parser.add_argument("--burstiness", type=float, default=1.0)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--policies", default=BASELINES)
    parser.add_argument("--num-requests", type=int, default=6000)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        if args.loads or args.capacity:
            found = pool.map(saturation, [(args.workload, s, args.num_requests) for s in seeds])
            by_seed = dict(zip(seeds, found, strict=True))
            print(json.dumps({"saturation_rps": by_seed}), flush=True)
        if args.capacity:
            points = [
                (args.workload, by_seed[seed], args.burstiness, seed, policy, args.num_requests)
                for seed, policy in itertools.product(seeds, args.policies.split(","))
            ]
            for row in pool.map(capacity, points):
                print(json.dumps(row), flush=True)
            return
        if args.loads:
            rates = [(s, load * by_seed[s]) for load in _floats(args.loads) for s in seeds]
        else:
            rates = [(s, rate) for s in seeds for rate in _floats(args.rates)]
        points = [
            (args.workload, rate, args.burstiness, seed, policy, args.num_requests)
            for (seed, rate), policy in itertools.product(rates, args.policies.split(","))
        ]
        for row in pool.map(run, points):
            print(json.dumps(row), flush=True)


def capacity(point: tuple[str, float, float, int, str, int]) -> dict:
    """Bisect the load (a share of `saturation`) for the highest with 90% attainment."""
    workload_name, saturation_rps, burstiness, seed, policy, num_requests = point
    low, high = 0.5, 1.5
    for _ in range(BISECTION_STEPS):
        load = (low + high) / 2
        point = (workload_name, load * saturation_rps, burstiness, seed, policy, num_requests)
        if run(point)["slo_attainment"] >= TARGET_ATTAINMENT:
            low = load
        else:
            high = load
    return {
        "workload": workload_name,
        "burstiness": burstiness,
        "seed": seed,
        "policy": policy,
        "capacity_load": low,
        "perfect_shedding_load": 1 / TARGET_ATTAINMENT,
        "share_of_bound": low * TARGET_ATTAINMENT,
    }


def _floats(text: str) -> list[float]:
    return [float(value) for value in text.split(",")]


if __name__ == "__main__":
    main()
