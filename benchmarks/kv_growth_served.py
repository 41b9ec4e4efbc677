"""Room to grow, served on this machine: `baton serve` with a KV cache too small for every
request it runs at full length, with the growth forecast (`slo`'s default) and without it
(`--no-kv-growth-forecast`: a prompt starts whenever its next chunk fits), the same burst of
requests through `baton bench` against each.

    PYTHONPATH=$PWD python benchmarks/kv_growth_served.py --rounds 2
    ... --checkpoint DIR      # a model of your own instead of the random bench Llama

The two alternate (reversed on odd rounds), each round a fresh server on the same model.
Before the burst, a warm-up of short requests gives the length predictor the answers it needs
before it forecasts. Per server: the burst's duration and output tok/s, TTFT and TPOT
percentiles, and the preemptions the engine counted (`/metrics`). The JSON report goes to
stdout, the markdown table to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import httpx
from disaggregation_served import Server, bench_llama, free_port

from baton.core.scheduling.kv_growth import MIN_OBSERVATIONS

VARIANTS = {"forecast": [], "no forecast": ["--no-kv-growth-forecast"]}
FIELDS = (
    "duration_s",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "preemptions",
)


def bench(url: str, args: argparse.Namespace, num_prompts: int, output_len: int) -> dict:
    """`baton bench`: every request at once, `--max-concurrency` at a time."""
    command = [sys.executable, "-m", "baton.app.cli", "bench", "--base-url", url]
    command += ["--dataset", "random", "--input-len", str(args.input_len), "--ignore-eos"]
    command += ["--output-len", str(output_len), "--range-ratio", str(args.range_ratio)]
    command += ["--num-prompts", str(num_prompts), "--seed", str(args.seed), "--json"]
    command += ["--max-concurrency", str(args.max_concurrency)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def preemptions(url: str) -> float:
    """The engine's preemptions so far, from its Prometheus counter."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("baton:num_preemptions_total"):
            return float(line.split()[-1])
    raise RuntimeError("/metrics has no baton:num_preemptions_total")


def run_round(model: Path, variant: str, args: argparse.Namespace, logs: Path) -> dict:
    flags = ["--num-kv-blocks", str(args.num_kv_blocks), "--max-num-seqs", str(args.max_num_seqs)]
    flags += ["--cpu-threads", str(args.cpu_threads), *VARIANTS[variant]]
    log = logs / f"{variant.replace(' ', '_')}.log"
    with Server(model, free_port(), flags, log) as server:
        bench(server.url, args, MIN_OBSERVATIONS, 4)
        before = preemptions(server.url)
        load_before = os.getloadavg()[0]
        result = bench(server.url, args, args.num_prompts, args.output_len)
        result["preemptions"] = preemptions(server.url) - before
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return {key: result[key] for key in (*FIELDS, "completed", "failed", "load_average")}


def report(rounds: dict[str, list[dict]]) -> str:
    lines = [
        "| server | " + " | ".join(FIELDS) + " |",
        "|---|" + "---|" * len(FIELDS),
    ]
    for variant, results in rounds.items():
        cells = []
        for field in FIELDS:
            values = [r[field] for r in results]
            each = ", ".join(f"{v:.1f}" for v in values)
            cells.append(f"{statistics.median(values):.1f} ({each})")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--checkpoint", type=Path, help="default: the random bench Llama")
    parser.add_argument("--num-kv-blocks", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--max-concurrency", type=int, default=48)
    parser.add_argument("--input-len", type=int, default=48, help="prompt words")
    parser.add_argument("--output-len", type=int, default=160)
    parser.add_argument("--range-ratio", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="baton-kv-growth-"))
    model = args.checkpoint or bench_llama(work / "bench-llama")
    rounds: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    started = datetime.now(UTC).isoformat(timespec="minutes")
    for index in range(args.rounds):
        order = list(VARIANTS) if index % 2 == 0 else list(reversed(VARIANTS))
        for variant in order:
            rounds[variant].append(run_round(model, variant, args, work))
    print(
        json.dumps(
            {"started": started, "args": vars(args) | {"checkpoint": str(model)}, "rounds": rounds},
            indent=2,
            default=str,
        )
    )
    print(report(rounds), file=sys.stderr)


if __name__ == "__main__":
    main()
