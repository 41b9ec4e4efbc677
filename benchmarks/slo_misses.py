"""Which requests miss their SLO, by class and by what they missed, under each policy and SLO
admission factor on the same arrivals: where one policy's attainment falls short of another's.

    python benchmarks/slo_misses.py --load 0.9 --seeds 0,1,2
    python benchmarks/slo_misses.py --load 0.9 --seeds 0 --runs priority:3,slo:3,slo:0

Simulated time (`baton simulate`'s defaults, as benchmarks/slo_attainment.py), 6,000 requests of
the mixed workload at a share of the seed's saturation. A run is `policy:factor`, the factor
being `--slo-admission-factor` (0: no admission control). A miss is `refused` (admission
control), `ttft`, `tpot` or `both`. One JSON line per run.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json

from slo_attainment import config_for

from baton.app.commands.simulate import saturation_rps
from baton.core.simulation.simulator import RequestRecord, simulate, summarize
from baton.core.simulation.workloads import sample_requests


def miss_kind(record: RequestRecord) -> str:
    if record.rejected:
        return "refused"
    ttft = record.ttft_ms_target is not None and record.ttft_ms > record.ttft_ms_target
    tpot = (
        record.tpot_ms_target is not None
        and record.num_output_tokens > 1
        and record.tpot_ms > record.tpot_ms_target
    )
    return "both" if ttft and tpot else "ttft" if ttft else "tpot" if tpot else "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--num-requests", type=int, default=6000)
    parser.add_argument("--runs", default="priority:3,slo:3,slo:0")
    args = parser.parse_args()
    for seed in map(int, args.seeds.split(",")):
        config = config_for(seed)
        rate = args.load * saturation_rps(args.workload, args.num_requests, seed, config)
        workload = sample_requests(args.workload, args.num_requests, rate, seed, 1.0)
        for run in args.runs.split(","):
            policy, factor = run.split(":")
            engine = dataclasses.replace(config.engine, slo_admission_factor=float(factor))
            result = simulate(policy, workload, dataclasses.replace(config, engine=engine))
            misses = collections.Counter(
                f"{record.class_name}/{miss_kind(record)}"
                for record in result.records
                if not record.slo_met
            )
            summary = summarize(result.records)
            print(
                json.dumps(
                    {
                        "seed": seed,
                        "load": args.load,
                        "policy": policy,
                        "admission_factor": float(factor),
                        "slo_attainment": summary["slo_attainment"],
                        "misses": dict(sorted(misses.items())),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
