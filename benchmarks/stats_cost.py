"""What polling `/v1/stats` costs the streams a server delivers, beside polling `/metrics`: token
throughput of WebSocket streams over the simulated (zero-cost) executor while one client polls
each path at `--poll-hz`, runs interleaved with a no-poll baseline.

    python benchmarks/stats_cost.py --streams 32 --seconds 6 --rounds 2 --poll-hz 50

Then each path is polled back to back with no streams running, and the server's CPU time per
request is reported: the cost itself, apart from a loaded loop's waits. The server is
server_throughput.py's child (its own process and event loop); a first run fills the stats
window with steps, so `/v1/stats` aggregates over a window as a long-lived server's does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from server_throughput import PROMPT, cpu_seconds, ws_client

POLLED = ("none", "/metrics", "/v1/stats")


async def poller(port: int, path: str, hz: float, deadline: float, costs: list[float]) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            (await client.get(path)).raise_for_status()
            costs.append(time.perf_counter() - started)
            await asyncio.sleep(max(0.0, 1 / hz - (time.perf_counter() - started)))


async def run(args: argparse.Namespace, polled: str) -> dict:
    frame = {"type": "generate", "prompt": PROMPT, "max_tokens": 128, "ignore_eos": True}
    deadline = time.perf_counter() + args.seconds
    gaps: list[float] = []
    costs: list[float] = []
    clients = [ws_client(args.port, frame, deadline, gaps) for _ in range(args.streams)]
    if polled != "none":
        clients.append(poller(args.port, polled, args.poll_hz, deadline, costs))
    started = time.perf_counter()
    tokens = sum(t for t in await asyncio.gather(*clients) if t)
    return {
        "polled": polled,
        "tokens_per_s": round(tokens / (time.perf_counter() - started)),
        "poll_ms_p50": round(statistics.median(costs) * 1e3, 2) if costs else None,
    }


def server_cpu_ms_per_poll(port: int, pid: int, path: str, polls: int) -> float:
    """The server's CPU time per request of `path`, polled back to back with nothing else
    running: the cost itself, apart from the waits a loaded loop adds to each reply."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        before = cpu_seconds(pid)
        for _ in range(polls):
            client.get(path).raise_for_status()
        return (cpu_seconds(pid) - before) / polls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--poll-hz", type=float, default=50)
    parser.add_argument("--port", type=int, default=8124)
    args = parser.parse_args()
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as scratch:
        from baton.tools.random_checkpoint import write_checkpoint

        checkpoint = str(write_checkpoint(Path(scratch) / "tiny", "llama", "tiny"))
        child = subprocess.Popen(
            [sys.executable, str(here / "server_throughput.py"), "--serve", "--port",
             str(args.port), "--streams", str(args.streams), "--checkpoint", checkpoint,
             "--switch-interval-ms", "5", "--observability", "on"],
        )  # fmt: skip
        try:
            for _ in range(600):
                try:
                    if httpx.get(f"http://127.0.0.1:{args.port}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            # Warms up and fills much of the window before the measured runs.
            results = [
                asyncio.run(run(argparse.Namespace(**{**vars(args), "seconds": 20}), "none"))
            ]
            for _ in range(args.rounds):
                results += [asyncio.run(run(args, polled)) for polled in POLLED]
            # Right after the runs, with their steps still in the window; interleaved.
            costs: dict[str, list[float]] = {"/metrics": [], "/v1/stats": []}
            for _ in range(3):
                for path, samples in costs.items():
                    samples.append(server_cpu_ms_per_poll(args.port, child.pid, path, 100))
        finally:
            child.terminate()
            child.wait(timeout=60)
    by_path = {
        polled: statistics.median(r["tokens_per_s"] for r in results[1:] if r["polled"] == polled)
        for polled in POLLED
    }
    print(
        json.dumps(
            {
                "runs": results[1:],
                "tokens_per_s_median": by_path,
                "stats_over_metrics_throughput": round(
                    by_path["/v1/stats"] / by_path["/metrics"], 3
                ),
                "server_cpu_ms_per_poll": {
                    path: round(statistics.median(samples), 3) for path, samples in costs.items()
                },
                "load_average": os.getloadavg(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
