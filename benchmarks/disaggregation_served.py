"""Prefill and decode apart, served on this machine: `baton serve --replicas 2` as one prefill and
one decode replica (`--prefill-replicas 1 --disaggregate always`) against two co-located
replicas (`--prefill-replicas 0`), and the same roles with Baton's choice per request
(`--disaggregate auto`), every replica on one CPU thread (`--cpu-threads 1 --replica-cpus 1`),
under a mixed workload: short chat streams, back to back, while long prompts arrive at a fixed
interval.

    PYTHONPATH=$PWD python benchmarks/disaggregation_served.py --rounds 2
    ... --server-args ""      # no TPOT target (default: --tpot-slo-ms 15 for every request)
    ... --checkpoint DIR      # a model of your own instead of the random bench Llama

The layouts alternate (reversed on odd rounds), each round a fresh server on the same model.
Per layout: the short streams' TPOT p99 (each request's own, from the server's `timing`), their
inter-token gap p99 as the client saw it, their TTFT p50 and p99, the long prompts' TTFT p50,
and the KV moved (`/v1/stats`); medians over the rounds. The JSON report goes to stdout, the
markdown table to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from baton.core.metrics import latency

# Two replicas, each on one CPU thread of its own.
REPLICAS = ["--replicas", "2", "--replica-cpus", "1", "--cpu-threads", "1"]
LAYOUTS = {
    "1 prefill + 1 decode": ["--prefill-replicas", "1", "--disaggregate", "always"],
    "2 co-located": ["--prefill-replicas", "0"],
    "1 + 1, auto": ["--prefill-replicas", "1", "--disaggregate", "auto"],
}


def bench_llama(folder: Path) -> Path:
    """The random-weight bench Llama (`baton.tools.random_checkpoint`), written once."""
    from baton.tools.random_checkpoint import write_checkpoint

    if not (folder / "config.json").is_file():
        write_checkpoint(folder, "llama", "bench")
    return folder


def percentile(values: list[float], q: float) -> float | None:
    return latency.percentile(sorted(values), q)


class Server:
    """`baton serve --device cpu` with `flags` in a subprocess on `port`, until the block
    ends."""

    def __init__(self, model: Path, port: int, flags: list[str], log: Path) -> None:
        command = [sys.executable, "-m", "baton.app.cli", "serve", "--model", str(model)]
        command += ["--device", "cpu", "--port", str(port), *flags]
        self.command = command
        self.url = f"http://127.0.0.1:{port}"
        self.log = log

    def __enter__(self) -> Server:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                self.command, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited; its log: {self.log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server did not become healthy; its log: {self.log}")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


async def one_request(
    client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int, timeout_s: float
) -> dict:
    """One streamed completion: client-side TTFT and token gaps, the server's timing; one that
    has not ended within `timeout_s` counts as an error, so a hung request shows in the report
    instead of stopping the benchmark."""
    try:
        return await asyncio.wait_for(_stream(client, url, prompt, max_tokens), timeout_s)
    except TimeoutError:
        return {
            "error": f"no end within {timeout_s:g} s",
            "ttft_ms": None,
            "gaps_ms": [],
            "tpot_ms": None,
        }


async def _stream(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int) -> dict:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.monotonic()
    arrivals: list[float] = []
    timing: dict = {}
    error = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                error = chunk["error"]["message"]
                break
            if chunk.get("choices"):
                arrivals.append(time.monotonic())
                timing = chunk.get("timing") or timing
            elif chunk.get("timing"):
                timing = chunk["timing"]
    return {
        "error": error,
        "ttft_ms": (arrivals[0] - sent) * 1000 if arrivals else None,
        "gaps_ms": [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)],
        "tpot_ms": timing.get("tpot_ms"),
    }


async def workload(url: str, args: argparse.Namespace, vocab: int, seed: int) -> dict:
    """`args.streams` short streams back to back and a long prompt every `args.long_every_s`,
    for `args.duration_s`; every request's record, by kind."""
    rng = random.Random(seed)
    records: dict[str, list[dict]] = {"short": [], "long": []}
    end = time.monotonic() + args.duration_s

    def prompt(length: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(length)]

    timeout_s = args.request_timeout_s
    async with httpx.AsyncClient(timeout=600) as client:
        # One of each first, untimed: the first requests' one-off costs stay out of the figures.
        await asyncio.gather(
            one_request(client, url, prompt(args.short_prompt), 4, timeout_s),
            one_request(client, url, prompt(args.long_prompt), 4, timeout_s),
        )

        async def short_stream() -> None:
            while time.monotonic() < end:
                short = prompt(args.short_prompt)
                record = await one_request(client, url, short, args.short_tokens, timeout_s)
                records["short"].append(record)

        async def long_arrivals() -> None:
            tasks = []
            while time.monotonic() < end:
                request = one_request(
                    client, url, prompt(args.long_prompt), args.long_tokens, timeout_s
                )
                tasks.append(asyncio.create_task(request))
                await asyncio.sleep(args.long_every_s)
            records["long"] = list(await asyncio.gather(*tasks))

        await asyncio.gather(*(short_stream() for _ in range(args.streams)), long_arrivals())
    return records


def summarise(records: dict[str, list[dict]], stats: dict) -> dict:
    short = [r for r in records["short"] if r["error"] is None]
    long = [r for r in records["long"] if r["error"] is None]
    tpots = [r["tpot_ms"] for r in short if r["tpot_ms"] is not None]
    gaps = [gap for r in short for gap in r["gaps_ms"]]
    ttfts = [r["ttft_ms"] for r in short if r["ttft_ms"] is not None]
    transfers = stats.get("kv_transfers") or {}
    return {
        "short_requests": len(short),
        "long_requests": len(long),
        "errors": sum(r["error"] is not None for rs in records.values() for r in rs),
        "short_tpot_p99_ms": percentile(tpots, 99),
        "short_tpot_p50_ms": percentile(tpots, 50),
        "short_gap_p99_ms": percentile(gaps, 99),
        "short_ttft_p50_ms": percentile(ttfts, 50),
        "short_ttft_p99_ms": percentile(ttfts, 99),
        "long_ttft_p50_ms": percentile([r["ttft_ms"] for r in long if r["ttft_ms"]], 50),
        "kv_transfers": transfers.get("count", 0),
        "kv_transfer_mean_ms": transfers.get("mean_ms", 0.0),
        "kv_bytes": transfers.get("bytes", 0),
    }


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_round(model: Path, layout: str, args: argparse.Namespace, seed: int, logs: Path) -> dict:
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    log = logs / f"{layout.replace(' ', '_').replace('+', 'and')}-{seed}.log"
    flags = [*REPLICAS, *LAYOUTS[layout], *shlex.split(args.server_args)]
    with Server(model, free_port(), flags, log) as server:
        load_before = os.getloadavg()[0]
        records = asyncio.run(workload(server.url, args, vocab, seed))
        stats = httpx.get(f"{server.url}/v1/stats", timeout=30).json()
        result = summarise(records, stats)
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return result


def median(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def report(rounds: dict[str, list[dict]]) -> str:
    def cell(layout: str, key: str) -> str:
        values = [r[key] for r in rounds[layout]]
        middle = median(values)
        each = ", ".join("–" if v is None else f"{v:.1f}" for v in values)
        return "–" if middle is None else f"{middle:.1f} ({each})"

    keys = [
        ("short TPOT p99 ms", "short_tpot_p99_ms"),
        ("short gap p99 ms", "short_gap_p99_ms"),
        ("short TTFT p50 ms", "short_ttft_p50_ms"),
        ("short TTFT p99 ms", "short_ttft_p99_ms"),
        ("long TTFT p50 ms", "long_ttft_p50_ms"),
        ("KV transfer mean ms", "kv_transfer_mean_ms"),
    ]
    lines = [
        "| layout | " + " | ".join(name for name, _ in keys) + " | requests (short/long/errors) |"
    ]
    lines.append("|---" * (len(keys) + 2) + "|")
    for layout, results in rounds.items():
        counts = ", ".join(
            f"{r['short_requests']}/{r['long_requests']}/{r['errors']}" for r in results
        )
        cells = " | ".join(cell(layout, key) for _, key in keys)
        lines.append(f"| {layout} | {cells} | {counts} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a model folder (default: the random bench Llama)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each layout")
    parser.add_argument("--duration-s", type=float, default=30.0, help="seconds of load a round")
    parser.add_argument("--streams", type=int, default=3, help="short streams at once")
    parser.add_argument("--short-prompt", type=int, default=32, help="short prompts' tokens")
    parser.add_argument("--short-tokens", type=int, default=48, help="short streams' output")
    parser.add_argument("--long-prompt", type=int, default=900, help="long prompts' tokens")
    parser.add_argument("--long-tokens", type=int, default=8, help="long prompts' output")
    parser.add_argument("--long-every-s", type=float, default=4.0, help="a long prompt every")
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=120.0,
        help="a request not ended within this counts as an error",
    )
    parser.add_argument(
        "--server-args",
        default="--tpot-slo-ms 15",
        help="more `baton serve` flags, for every layout (the TPOT target is what --disaggregate "
        "auto and the slo planner's prefill cap weigh)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="baton-disaggregation-served-"))
    model = Path(args.checkpoint) if args.checkpoint else bench_llama(scratch / "llama-bench")
    rounds: dict[str, list[dict]] = {layout: [] for layout in LAYOUTS}
    started = datetime.now(UTC).isoformat(timespec="minutes")
    for index in range(args.rounds):
        order = list(LAYOUTS) if index % 2 == 0 else list(reversed(list(LAYOUTS)))
        for layout in order:
            result = run_round(model, layout, args, seed=index, logs=scratch)
            print(f"{layout}, round {index}: {json.dumps(result)}", file=sys.stderr)
            rounds[layout].append(result)
    summary = {
        "started": started,
        "model": str(model),
        "cpu_count": os.cpu_count(),
        "settings": vars(args),
        "rounds": rounds,
    }
    print(json.dumps(summary, indent=2))
    print(report(rounds), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
