"""Speculative decoding at one stream: Baton with prompt lookup (`--speculative-method ngram`)
against Baton without it, and, where its `llama-server` is built, llama.cpp with and without its
own prompt lookup (`--spec-type ngram-simple`), on the same weights and the same prompts.

    PYTHONPATH=$PWD python benchmarks/speculative.py --rounds 3 --json out.json
    ... --model DIR         # another checkpoint (default: the shipped demo model)
    ... --no-llama-cpp      # Baton's two sides only

Two workloads over the same prompts (Python documentation, which the demo model was trained on):
`repetitive`, greedy answers of `--output-len` tokens past EOS, which a small model's greedy
decoding turns into loops that a lookup predicts (it cannot quote a paragraph back, so this is
the repetitive workload it has); and `sampled`, the same at temperature 1, whose text rarely
repeats, so drafts are mostly rejected and the figure is speculation's overhead. Every side's
server starts afresh each round, one at a time, sides in reverse order on odd rounds; a figure
is the median over rounds of output tokens per second (completion tokens over the request's
wall time) and of the server's CPU time per output token (steadier on a busy machine), each
ratio (×) against plain Baton's median of the same workload, higher better. The JSON report goes
to stdout, progress and the markdown table to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from llama_cpp_peer import binary, convert, llama_server_command, peers_dir
from vs_llama_cpp import REPO, child_env, first_answer, load_1min

DEMO_MODEL = REPO / "app" / "demo_model"
PROMPTS = (
    "Return a new list containing all items from the iterable in ascending order.",
    "The try statement specifies exception handlers and cleanup code.",
    "The finally clause is always executed before leaving the try statement.",
    "The with statement is used to wrap the execution of a block.",
    "A for loop iterates over the items of any sequence.",
    "The except clause may name several exceptions as a parenthesized tuple.",
    "The raise statement forces a specified exception to occur.",
    "The json module encodes Python objects as JSON text.",
)
# Workload name → sampling temperature.
WORKLOADS = {"repetitive": 0.0, "sampled": 1.0}


@dataclass(frozen=True, slots=True)
class Side:
    name: str
    llama_server: Path | None = None
    extra_args: tuple[str, ...] = ()


def sides(args: argparse.Namespace) -> list[Side]:
    k = str(args.num_speculative_tokens)
    found = [
        Side("baton"),
        Side("baton+ngram", None, ("--speculative-method", "ngram", "--num-speculative-tokens", k)),
    ]
    server = binary(peers_dir(), "llama-server")
    if not args.no_llama_cpp and server.is_file():
        lookup = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", k)
        found += [Side("llama.cpp", server), Side("llama.cpp+lookup", server, lookup)]
    elif not args.no_llama_cpp:
        print(f"no {server}: llama.cpp's sides left out (llama_cpp_peer.py build)", file=sys.stderr)
    return found


def server_command(side: Side, args: argparse.Namespace, gguf: Path | None) -> list[str]:
    context = 64 + args.output_len
    if side.llama_server is not None:
        assert gguf is not None
        command = llama_server_command(side.llama_server, gguf, args.port, 1, context, args.threads)
        return [*command, *side.extra_args]
    return [
        *(sys.executable, "-m", "baton.app.cli", "serve", "--model", str(args.model)),
        *("--host", "127.0.0.1", "--port", str(args.port), "--device", "cpu"),
        *("--max-num-seqs", "1", "--max-model-len", str(context)),
        *side.extra_args,
    ]


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used (user and system, all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_stream(
    port: int, prompt: str, temperature: float, args: argparse.Namespace
) -> tuple[int, float]:
    """Output tokens of one request alone, and its wall time."""
    base = f"http://127.0.0.1:{port}"
    model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": args.output_len,
        "temperature": temperature,
        "seed": args.seed,
        "ignore_eos": True,
    }
    started = time.perf_counter()
    reply = httpx.post(f"{base}/v1/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - started
    reply.raise_for_status()
    return reply.json()["usage"]["completion_tokens"], elapsed


def measure(side: Side, round_: int, args: argparse.Namespace, gguf: Path | None) -> dict:
    """Start `side`'s server, warm it up, run every workload's prompts one at a time, stop it."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", args.port)) == 0:
            raise RuntimeError(f"port {args.port} is taken: choose another with --port")
    log_path = args.log_dir / f"{side.name.replace('+', '_')}-{round_}.log"
    load = load_1min()
    figures, cpu_ms = {}, {}
    with log_path.open("w") as log:
        server = subprocess.Popen(
            server_command(side, args, gguf),
            cwd=REPO,
            # The caller's PYTHONPATH, so the servers run the checkout the script runs from.
            env=child_env(args.threads) | {"PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            first_answer(server, args.port, time.perf_counter(), args.start_timeout)
            for workload, temperature in WORKLOADS.items():
                cpu_before = cpu_seconds(server.pid)
                runs = [one_stream(args.port, p, temperature, args) for p in PROMPTS]
                used = cpu_seconds(server.pid) - cpu_before
                figures[workload] = statistics.median(tokens / wall for tokens, wall in runs)
                cpu_ms[workload] = used * 1e3 / sum(tokens for tokens, _ in runs)
        finally:
            server.terminate()
            server.wait(timeout=60)
    return {
        "side": side.name,
        "round": round_,
        "load_1min": load,
        "tok_s": figures,
        "cpu_ms_per_token": cpu_ms,
    }


def report(measurements: list[dict], names: list[str]) -> tuple[dict, str]:
    """Medians over rounds; on a busy machine the server's CPU time per token is the steadier
    figure, as waiting for a core does not count in it."""

    def median(name: str, key: str, workload: str) -> float:
        return statistics.median(m[key][workload] for m in measurements if m["side"] == name)

    medians = {
        name: {
            key: {w: median(name, key, w) for w in WORKLOADS}
            for key in ("tok_s", "cpu_ms_per_token")
        }
        for name in names
    }
    heading = " | ".join(f"{w} tok/s | × | {w} CPU ms/tok | ×" for w in WORKLOADS)
    rows = [f"| side | {heading} |", "|---|" + "---:|" * 4 * len(WORKLOADS)]
    base = medians["baton"]
    for name in names:
        own = medians[name]
        cells = [
            f"{own['tok_s'][w]:.1f} | {own['tok_s'][w] / base['tok_s'][w]:.2f} | "
            f"{own['cpu_ms_per_token'][w]:.2f} | "
            f"{base['cpu_ms_per_token'][w] / own['cpu_ms_per_token'][w]:.2f}"
            for w in WORKLOADS
        ]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    loads = [m["load_1min"] for m in measurements]
    rows.append(f"\nload average (1 min) {min(loads):.1f}-{max(loads):.1f} over the runs")
    return {"medians": medians, "measurements": measurements}, "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEMO_MODEL)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    # One thread: on a shared machine an OpenMP pool waits for preempted threads at every barrier.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/baton-speculative"))
    parser.add_argument("--json", type=Path, help="also write the JSON report here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    chosen = sides(args)
    gguf = None
    if any(side.llama_server is not None for side in chosen):
        gguf = convert(peers_dir(), args.model.resolve(), peers_dir() / "models")
    measurements = []
    for round_ in range(args.rounds):
        order = chosen if round_ % 2 == 0 else chosen[::-1]
        for side in order:
            measurement = measure(side, round_, args, gguf)
            print(json.dumps(measurement), file=sys.stderr)
            measurements.append(measurement)
    result, table = report(measurements, [side.name for side in chosen])
    print(table, file=sys.stderr)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
