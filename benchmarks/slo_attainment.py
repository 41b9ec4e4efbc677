"""SLO attainment of every policy on the same arrivals, over seeds and load points: the table
issue 19's targets are stated in. Simulated time (core/simulator.py, `baton simulate`'s
defaults), so the machine's load changes the wall time only.

    python benchmarks/slo_attainment.py --loads 0.8,0.9,1.0,1.05 --seeds 0,1,2,3,4 --jobs 2

A load is a share of the seed's saturation rate: the throughput `fcfs` reaches with every
request queued at once (`baton simulate --load`). One JSON line per run.
"""

from __future__ import annotations

import argparse
import itertools
import json
from concurrent.futures import ProcessPoolExecutor

from app.simulate import saturation_rps
from core.config import EngineConfig
from core.simulator import SimulationConfig, simulate, summarize
from core.workloads import sample_requests

BASELINES = "slo,sjf,fcfs,hrrn,ltr,priority"


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
    parser.add_argument("--burstiness", type=float, default=1.0)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--policies", default=BASELINES)
    parser.add_argument("--num-requests", type=int, default=6000)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        if args.loads:
            found = pool.map(saturation, [(args.workload, s, args.num_requests) for s in seeds])
            by_seed = dict(zip(seeds, found, strict=True))
            print(json.dumps({"saturation_rps": by_seed}), flush=True)
            rates = [(s, load * by_seed[s]) for s in seeds for load in _floats(args.loads)]
        else:
            rates = [(s, rate) for s in seeds for rate in _floats(args.rates)]
        points = [
            (args.workload, rate, args.burstiness, seed, policy, args.num_requests)
            for (seed, rate), policy in itertools.product(rates, args.policies.split(","))
        ]
        for row in pool.map(run, points):
            print(json.dumps(row), flush=True)


def _floats(text: str) -> list[float]:
    return [float(value) for value in text.split(",")]


if __name__ == "__main__":
    main()
