"""`baton bench` replaying a trace against `baton serve`, beside `baton simulate` replaying the
same trace on the server's own step-cost fit (`--calibrate-from`): measured goodput and SLO
attainment against the simulator's prediction (issue 19: goodput within 10%).

    PYTHONPATH=$PWD python benchmarks/trace_vs_simulator.py --rates 6 10 --rounds 2

The trace is the `mixed` workload (gamma arrivals of shape `--burstiness` at each rate) with
prompts and answers scaled by `--length-scale` and SLO targets by `--slo-scale`, so that the 32M
bench Llama on a CPU sees chat-shaped load; it is written as JSONL with each row's targets and
replayed by both tools, the bench sending token-id prompts of exactly the trace's lengths. Per
round and rate, on a fresh server: a warm-up replay of the trace with other prompts (its steps
are what the server's fit learns from; the same prompts would hit the prefix cache in the
measured replay), the simulator on the fit read then, and the measured replay. One JSON line
per measurement on stdout.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vs_llama_cpp import checkpoint, child_env, first_answer, load_1min, machine

from baton.core.simulation.workloads import sample_requests

SERVER_FLAGS = ("--max-num-seqs", "16", "--max-num-batched-tokens", "512")


def write_trace(path: Path, args: argparse.Namespace, rate: float) -> int:
    """The trace at `rate` as JSONL rows with their own (scaled) targets; returns its rows."""
    requests = sample_requests(
        "mixed", args.num_requests, rate, args.seed, args.burstiness, args.length_scale
    )
    with path.open("w") as file:
        for request in requests:
            cls = request.request_class
            row = {
                "arrival_s": round(request.arrival_s, 6),
                "prompt_tokens": request.prompt_len,
                "output_tokens": request.output_len,
                "ttft_ms": cls.ttft_ms * args.slo_scale,
                "tpot_ms": cls.tpot_ms * args.slo_scale,
                "priority": cls.priority,
                "class": cls.name,
            }
            file.write(json.dumps(row) + "\n")
    return len(requests)


def bench(url: str, trace: Path, seed: int) -> dict:
    """The trace replayed; `seed` draws its prompts' token ids (the simulator does not look at
    them, but the server's prefix cache would: a replay of the same prompts skips prefill)."""
    command = [
        *(sys.executable, "-m", "baton.app.cli", "bench", "--base-url", url, "--seed", str(seed)),
        *("--dataset", "trace", "--trace-file", str(trace), "--token-prompts"),
        *("--slo-classes", "--send-slo", "--ignore-eos", "--json"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=child_env(2))
    return json.loads(done.stdout)


def simulate(url: str, trace: Path) -> dict:
    command = [
        *(sys.executable, "-m", "baton.app.cli", "simulate", "--workload-file", str(trace)),
        *("--calibrate-from", url, *SERVER_FLAGS, "--policy", "slo", "--json"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=child_env(1))
    report = json.loads(done.stdout)
    return report["slo"]


def measure(model: Path, trace: Path, rate: float, round_: int, log_dir: Path) -> dict:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    serve = [
        *(sys.executable, "-m", "baton.app.cli", "serve", "--model", str(model), "--device", "cpu"),
        *("--host", "127.0.0.1", "--port", str(port), *SERVER_FLAGS),
        *("--scheduling-policy", "slo"),
    ]
    log = (log_dir / f"serve-{rate:g}-{round_}.log").open("w")
    server = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, env=child_env(2))
    try:
        first_answer(server, port, time.perf_counter(), 300.0)
        load_before = load_1min()
        warm_up = bench(url, trace, seed=1)
        predicted = simulate(url, trace)
        measured = bench(url, trace, seed=0)
        return {
            "rate": rate,
            "round": round_,
            "load_1min": [load_before, load_1min()],
            "warm_up_goodput_rps": warm_up["goodput_rps"],
            "measured_goodput_rps": measured["goodput_rps"],
            "simulated_goodput_rps": predicted["goodput_rps"],
            "sim_over_measured": predicted["goodput_rps"] / measured["goodput_rps"] - 1,
            "measured_attainment": measured["slo_attainment"],
            "simulated_attainment": predicted["slo_attainment"],
            "measured_ttft_p99_ms": measured["p99_ttft_ms"],
            "simulated_ttft_p99_ms": predicted["ttft_p99_ms"],
            "measured_tpot_p99_ms": measured["p99_tpot_ms"],
            "simulated_tpot_p99_ms": predicted["tpot_p99_ms"],
        }
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[6.0, 10.0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-requests", type=int, default=300)
    parser.add_argument("--burstiness", type=float, default=0.5)
    parser.add_argument("--length-scale", type=float, default=0.1)
    parser.add_argument("--slo-scale", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0, help="the trace's draw")
    parser.add_argument("--preset", default="bench", help="baton.tools.random_checkpoint preset")
    args = parser.parse_args()
    model = checkpoint(args.preset)
    print(json.dumps({"machine": machine(), "args": vars(args)}), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for rate in args.rates if round_ % 2 == 0 else args.rates[::-1]:
                trace = Path(folder) / f"trace-{rate:g}.jsonl"
                rows = write_trace(trace, args, rate)
                row = measure(model, trace, rate, round_, Path(folder))
                print(json.dumps({"rows": rows, **row}), flush=True)


if __name__ == "__main__":
    main()
