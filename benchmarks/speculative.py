"""Speculative decoding at one stream: Baton with prompt lookup (`--speculative-method ngram`)
against Baton without it, and, where its `llama-server` is built, llama.cpp with and without its
own lookup decoding (`--spec-type ngram-simple`, `ngram-mod`, `ngram-cache`), on the same
weights and the same prompts.

    PYTHONPATH=$PWD python benchmarks/speculative.py --rounds 3 --json out.json
    ... --model DIR         # another checkpoint (default: speculative_workload's looping Llama)
    ... --no-llama-cpp      # Baton's two sides only

Two workloads over the same prompts (token ids, so both servers read the same tokens): a seed
text and the model's own greedy continuation of it (`speculative_workload.py`). `quoting` is
greedy answers of `--output-len` tokens past EOS, which continue that text and so quote the
prompt; `sampled` is the same at temperature 1, whose text rarely repeats, so drafts are rare
and mostly rejected and the figure is speculation's overhead. Each prompt is prefilled by a
one-token request just before it is measured, so the figures are of decoding. Every side's
server starts afresh each round, one at a time, sides in reverse order on odd rounds; a figure
is the median over rounds of output tokens per second (completion tokens over the request's
wall time) and of the server's CPU time per output token (steadier on a busy machine), each
ratio (×) against plain Baton's median of the same workload, higher better; the acceptance rate
is each side's own count of accepted draft tokens over drafted ones. The JSON report goes to
stdout, progress and the markdown table to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from llama_cpp_peer import binary, convert, llama_server_command, peers_dir
from speculative_workload import loop_checkpoint, quoting_prompts
from vs_llama_cpp import REPO, child_env, cpu_seconds, first_answer, load_1min

# Workload name → sampling temperature.
WORKLOADS = {"quoting": 0.0, "sampled": 1.0}
# llama.cpp's lookup decoding, each a side: ngram-simple shaped as Baton's proposer (the latest
# match of the last 2 tokens, k drafts), and ngram-mod and ngram-cache at llama.cpp's defaults.
# `{k}` becomes --num-speculative-tokens.
LLAMA_LOOKUPS = (
    "--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m {k}",
    "--spec-type ngram-mod",
    "--spec-type ngram-cache",
)


@dataclass(frozen=True, slots=True)
class Side:
    name: str
    llama_server: Path | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    """One request's completion tokens and wall time, and its drafts where the server reports
    them per request (llama.cpp's `timings`)."""

    tokens: int
    wall_s: float
    drafted: int = 0
    accepted: int = 0


def sides(args: argparse.Namespace) -> list[Side]:
    k = str(args.num_speculative_tokens)
    found = [
        Side("baton"),
        Side("baton+ngram", None, ("--speculative-method", "ngram", "--num-speculative-tokens", k)),
    ]
    server = binary(peers_dir(), "llama-server")
    if not args.no_llama_cpp and server.is_file():
        found.append(Side("llama.cpp", server))
        for lookup in args.llama_lookup:
            words = shlex.split(lookup.format(k=k))
            name = words[words.index("--spec-type") + 1] if "--spec-type" in words else "lookup"
            found.append(Side(f"llama.cpp+{name}", server, tuple(words)))
    elif not args.no_llama_cpp:
        print(f"no {server}: llama.cpp's sides left out (llama_cpp_peer.py build)", file=sys.stderr)
    return found


def server_command(
    side: Side, args: argparse.Namespace, gguf: Path | None, context: int
) -> list[str]:
    if side.llama_server is not None:
        assert gguf is not None
        command = llama_server_command(side.llama_server, gguf, args.port, 1, context, args.threads)
        return [*command, *side.extra_args]
    return [
        *(sys.executable, "-m", "baton.app.cli", "serve", "--model", str(args.model)),
        *("--host", "127.0.0.1", "--port", str(args.port), "--device", "cpu"),
        # Baton's step threads default to the cores it may use, not to OMP_NUM_THREADS.
        *("--cpu-threads", str(args.threads)),
        *("--max-num-seqs", "1", "--max-model-len", str(context)),
        *side.extra_args,
    ]


def one_stream(
    client: httpx.Client,
    model: str,
    pid: int,
    prompt: list[int],
    temperature: float,
    args: argparse.Namespace,
) -> tuple[Answer, float]:
    """One request alone, and the server's CPU seconds over it. The prompt is sent once before
    with one output token, so that both servers hold it in their prompt caches and the request
    measured is its decoding: the prefill is the same work with speculation or without. The
    client is made once per server: a new one per request (`httpx.post`) builds an SSL context
    inside the timed request, as long as a few decode steps."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    client.post("/v1/completions", json=body).raise_for_status()
    body |= {"max_tokens": args.output_len, "temperature": temperature, "seed": args.seed}
    cpu_before = cpu_seconds(pid)
    started = time.perf_counter()
    reply = client.post("/v1/completions", json=body)
    elapsed = time.perf_counter() - started
    cpu_s = cpu_seconds(pid) - cpu_before
    reply.raise_for_status()
    answer = reply.json()
    timings = answer.get("timings") or {}
    drafted, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    return Answer(answer["usage"]["completion_tokens"], elapsed, drafted, accepted), cpu_s


def baton_drafts(client: httpx.Client) -> tuple[int, int]:
    """Baton's draft tokens and accepted ones since it started (0, 0 when it does not speculate)."""
    spec = client.get("/v1/stats").json().get("spec_decode") or {}
    return spec.get("num_draft_tokens", 0), spec.get("num_accepted_tokens", 0)


def measure(
    side: Side, round_: int, args: argparse.Namespace, gguf: Path | None, prompts: list[list[int]]
) -> dict:
    """Start `side`'s server, warm it up, run every workload's prompts one at a time, stop it."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", args.port)) == 0:
            raise RuntimeError(f"port {args.port} is taken: choose another with --port")
    log_path = args.log_dir / f"{side.name.replace('+', '_')}-{round_}.log"
    context = -(-(max(map(len, prompts)) + args.output_len + 16) // 128) * 128
    load = load_1min()
    base = f"http://127.0.0.1:{args.port}"
    figures, cpu_ms, acceptance = {}, {}, {}
    with log_path.open("w") as log, httpx.Client(base_url=base, timeout=600) as client:
        server = subprocess.Popen(
            server_command(side, args, gguf, context),
            cwd=REPO,
            # The caller's PYTHONPATH, so the servers run the checkout the script runs from.
            env=child_env(args.threads) | {"PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            first_answer(server, args.port, time.perf_counter(), args.start_timeout)
            model = client.get("/v1/models").json()["data"][0]["id"]
            for workload, temperature in WORKLOADS.items():
                drafts_before = baton_drafts(client) if side.llama_server is None else (0, 0)
                timed = [
                    one_stream(client, model, server.pid, p, temperature, args) for p in prompts
                ]
                runs = [run for run, _ in timed]
                used = sum(cpu_s for _, cpu_s in timed)
                if side.llama_server is None:
                    after = baton_drafts(client)
                    drafted, accepted = (a - b for a, b in zip(after, drafts_before, strict=True))
                else:
                    drafted = sum(run.drafted for run in runs)
                    accepted = sum(run.accepted for run in runs)
                figures[workload] = statistics.median(run.tokens / run.wall_s for run in runs)
                cpu_ms[workload] = used * 1e3 / sum(run.tokens for run in runs)
                acceptance[workload] = accepted / drafted if drafted else None
        finally:
            server.terminate()
            server.wait(timeout=60)
    return {
        "side": side.name,
        "round": round_,
        "load_1min": load,
        "tok_s": figures,
        "cpu_ms_per_token": cpu_ms,
        "acceptance": acceptance,
    }


def report(measurements: list[dict], names: list[str]) -> tuple[dict, str]:
    """Medians over rounds; on a busy machine the server's CPU time per token is the steadier
    figure, as waiting for a core does not count in it."""

    def median(name: str, key: str, workload: str) -> float | None:
        values = [m[key][workload] for m in measurements if m["side"] == name]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    medians = {
        name: {
            key: {w: median(name, key, w) for w in WORKLOADS}
            for key in ("tok_s", "cpu_ms_per_token", "acceptance")
        }
        for name in names
    }
    heading = " | ".join(f"{w} tok/s | × | {w} CPU ms/tok | × | accepted" for w in WORKLOADS)
    rows = [f"| side | {heading} |", "|---|" + "---:|" * 5 * len(WORKLOADS)]
    base = medians["baton"]
    for name in names:
        own = medians[name]
        cells = []
        for w in WORKLOADS:
            rate = own["acceptance"][w]
            cells.append(
                f"{own['tok_s'][w]:.1f} | {own['tok_s'][w] / base['tok_s'][w]:.2f} | "
                f"{own['cpu_ms_per_token'][w]:.2f} | "
                f"{base['cpu_ms_per_token'][w] / own['cpu_ms_per_token'][w]:.2f} | "
                + ("" if rate is None else f"{rate:.2f}")
            )
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    lookups = [name for name in names if name.startswith("llama.cpp+")]
    if "baton+ngram" in names and lookups:
        for key, unit in (("tok_s", "tok/s"), ("cpu_ms_per_token", "CPU per token")):
            sign = 1 if key == "tok_s" else -1
            best = max(lookups, key=lambda name: sign * medians[name][key]["quoting"])
            ours = medians["baton+ngram"][key]["quoting"] / medians[best][key]["quoting"]
            rows.append(
                f"\nbaton+ngram / the best llama.cpp lookup ({best}), quoting {unit}: "
                f"{ours if sign > 0 else 1 / ours:.2f}×"
            )
    loads = [m["load_1min"] for m in measurements]
    rows.append(f"\nload average (1 min) {min(loads):.1f}-{max(loads):.1f} over the runs")
    return {"medians": medians, "measurements": measurements}, "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the looping Llama")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--seed-words", type=int, default=12)
    parser.add_argument("--quote-len", type=int, default=256, help="tokens of the prompt's quote")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument(
        "--llama-lookup",
        nargs="*",
        default=list(LLAMA_LOOKUPS),
        help="llama-server flags of each llama.cpp side with lookup decoding",
    )
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
    args.model = (args.model or loop_checkpoint()).resolve()
    prompts = quoting_prompts(args.model, args.prompts, args.seed_words, args.quote_len)
    chosen = sides(args)
    gguf = None
    if any(side.llama_server is not None for side in chosen):
        gguf = convert(peers_dir(), args.model, peers_dir() / "gguf")
    measurements = []
    for round_ in range(args.rounds):
        order = chosen if round_ % 2 == 0 else chosen[::-1]
        for side in order:
            measurement = measure(side, round_, args, gguf, prompts)
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
