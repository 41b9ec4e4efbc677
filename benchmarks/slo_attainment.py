"""SLO attainment of every policy on the same arrivals, over seeds and load points: the table
issue 19's targets are stated in. Simulated time (core/simulator.py, `baton simulate`'s
defaults), so the machine's load changes the wall time only.

    python benchmarks/slo_attainment.py --rates 10.8 --seeds 0,1,2,3,4 --burstiness 1 --jobs 2
"""

from __future__ import annotations

import argparse
import itertools
import json
from concurrent.futures import ProcessPoolExecutor

from core.config import EngineConfig
from core.simulator import SimulationConfig, simulate, summarize
from core.workloads import sample_requests

BASELINES = "slo,sjf,fcfs,hrrn,ltr,priority"


def run(point: tuple[str, float, float, int, str, int]) -> dict:
    workload_name, rate, burstiness, seed, policy, num_requests = point
    workload = sample_requests(workload_name, num_requests, rate, seed, burstiness)
    config = SimulationConfig(
        engine=EngineConfig(enable_prefix_caching=False), noise=0.05, seed=seed
    )
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
    parser.add_argument("--rates", default="10.8", help="comma-separated requests per second")
    parser.add_argument("--burstiness", type=float, default=1.0)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--policies", default=BASELINES)
    parser.add_argument("--num-requests", type=int, default=6000)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    points = [
        (args.workload, rate, args.burstiness, seed, policy, args.num_requests)
        for rate, seed, policy in itertools.product(
            [float(r) for r in args.rates.split(",")],
            [int(s) for s in args.seeds.split(",")],
            args.policies.split(","),
        )
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(run, points):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
