"""Serving with replicas on this machine (issue 16), `baton bench` driving real servers,
configurations interleaved round by round so a shared machine's drift hits each alike.

    python benchmarks/replica_serving.py threads --rounds 2
    python benchmarks/replica_serving.py overhead --rounds 2

`threads`: the bench model (baton.tools.random_checkpoint's `bench` preset) served as 1 replica with
2 torch threads (`baton serve`, the single-process server) and as 2 replicas with 1 CPU each (`baton
serve --replicas 2 --replica-cpus 1`'s code: Ray gives each actor OMP_NUM_THREADS=1), at an
open-loop request rate below saturation (TTFT) and with every request at once (throughput).
`overhead`: the tiny model, where the forward costs least, as the single-process server and as one
Ray replica of both CPUs behind the front end, every request at once: the replica path (one Ray
message per step, the follower task, the ledger, and the engine in a process of its own) against the
single-process server. In the replica runs the front end's own work per request is timed inside the
server: the admission forecast over every replica (`forecast_ttft`) and routing plus the submit
(`_send`: hashing the prompt's blocks, the router, the ledger, the actor call). For a 2-CPU machine
(the split of CPUs is fixed). One JSON line per run, then a summary per configuration.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from baton.core.metrics.latency import percentile

HEALTH_WAIT_S = 600.0
MAX_NUM_SEQS = 32
TTFT_SLO_MS = 600_000


def serve_command(kind: str, model: str, port: int, timings: str) -> tuple[list[str], dict]:
    """The server for one configuration, and its environment."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # Ray sets it per actor from its CPUs
    if kind in ("1x2", "single"):
        # A TTFT target for every request, far above what it takes, so admission asks the
        # forecast (over every replica, with replicas) and refuses nothing.
        flags = ["--device", "cpu", "--port", str(port), "--max-num-seqs", str(MAX_NUM_SEQS)]
        flags += ["--ttft-slo-ms", str(TTFT_SLO_MS)]
        env["OMP_NUM_THREADS"] = "2"
        return [sys.executable, "-m", "baton.app.cli", "serve", "--model", model, *flags], env
    # "2x1" / "ray-1": `baton serve --replicas N` (2 replicas of 1 CPU, 1 of 2), timed.
    replicas = "2" if kind == "2x1" else "1"
    child = [sys.executable, __file__, "serve-timed", "--model", model, "--port", str(port)]
    return [*child, "--replicas", replicas, "--timings", timings], env


def serve_timed(args: argparse.Namespace) -> None:
    """Child: `baton serve --replicas N` as app/replicas/replica_server.py's `serve_replicas`
    runs it, the 2 CPUs split between the replicas, with the front end's replica work per request
    timed; the timings go to `--timings` when the server stops."""
    import ray

    from baton.app.http.server import serve_front_end
    from baton.app.replicas.replica_server import start_replicas
    from baton.app.replicas.replica_settings import ReplicaModel, ReplicaSettings
    from baton.app.settings import ServerSettings
    from baton.core.config import EngineConfig
    from baton.core.text.tokenizer import Tokenizer

    cpus = 2 / args.replicas
    spec = ReplicaModel(args.model, EngineConfig(max_num_seqs=MAX_NUM_SEQS), device="cpu")
    settings = ReplicaSettings(num_replicas=args.replicas, num_cpus=cpus)
    engine = start_replicas(spec, settings, max_queued_requests=256)
    timings: dict[str, list[float]] = {"forecast_ttft": [], "send": []}
    _time_method(engine, "forecast_ttft", timings["forecast_ttft"])
    _time_method(engine, "_send", timings["send"])
    try:
        serve_front_end(
            engine,
            Tokenizer.from_pretrained(args.model),
            "bench",
            ServerSettings(port=args.port, ttft_slo_ms=TTFT_SLO_MS),
        )
    finally:
        Path(args.timings).write_text(json.dumps(timings))
        ray.shutdown()


def _time_method(engine: object, name: str, into: list[float]) -> None:
    method = getattr(engine, name)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - started)

    setattr(engine, name, timed)


def bench(port: int, args: argparse.Namespace, rate: str) -> dict:
    command = [
        sys.executable,
        "-m",
        "baton.app.cli",
        "bench",
        "--base-url",
        f"http://127.0.0.1:{port}",
    ]
    command += ["--dataset", "random", "--input-len", str(args.input_len)]
    command += ["--output-len", str(args.output_len), "--num-prompts", str(args.num_prompts)]
    command += ["--request-rate", rate, "--ignore-eos", "--seed", "0", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def run_one(kind: str, model: str, args: argparse.Namespace, scratch: Path) -> list[dict]:
    """Start one configuration's server, bench it at each rate in turn, stop it."""
    timings = scratch / f"timings-{kind}.json"
    command, env = serve_command(kind, model, args.port, str(timings))
    started = time.monotonic()
    summaries = []
    with open(scratch / f"serve-{kind}.log", "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(args.port, server)
            ready_s = time.monotonic() - started
            for rate in args.rate.split(","):
                summaries.append((rate, os.getloadavg()[0], bench(args.port, args, rate)))
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()
    rows = [
        {
            "config": kind,
            "rate": rate,
            "ready_s": round(ready_s, 1),
            "load_average": load,
            "completed": summary["completed"],
            "failed": summary["failed"],
            "request_throughput": summary["request_throughput"],
            "output_throughput": summary["output_throughput"],
            "ttft_p50_ms": summary["median_ttft_ms"],
            "ttft_p99_ms": summary["p99_ttft_ms"],
            "tpot_p50_ms": summary["median_tpot_ms"],
            "itl_p99_ms": summary["p99_itl_ms"],
            "errors": summary["errors"],
        }
        for rate, load, summary in summaries
    ]
    if timings.exists():
        # One server's decisions over every rate it served.
        for name, values in json.loads(timings.read_text()).items():
            if not values:
                continue
            values.sort()
            rows[-1][f"{name}_us_p50"] = percentile(values, 50) * 1e6
            rows[-1][f"{name}_us_p99"] = percentile(values, 99) * 1e6
            rows[-1][f"{name}_calls"] = len(values)
    return rows


def _wait_healthy(port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + HEALTH_WAIT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before serving")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy in time")


def checkpoint(preset: str, scratch: Path) -> str:
    from baton.tools.random_checkpoint import write_checkpoint

    return str(write_checkpoint(scratch / preset, "llama", preset))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["threads", "overhead", "serve-timed"])
    parser.add_argument("--model", default=None, help="checkpoint (default: a random one)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8431)
    parser.add_argument(
        "--rate", default=None, help="comma-separated requests per second (inf: all at once)"
    )
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--input-len", type=int, default=None, help="prompt words")
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--timings", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode == "serve-timed":
        serve_timed(args)
        return
    threads = args.mode == "threads"
    defaults = (
        {"rate": "2,inf", "num_prompts": 64, "input_len": 64, "output_len": 64}
        if threads
        else {"rate": "inf", "num_prompts": 96, "input_len": 16, "output_len": 128}
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    kinds = ["1x2", "2x1"] if threads else ["single", "ray-1"]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or checkpoint("bench" if threads else "tiny", Path(scratch))
        for round_index in range(args.rounds):
            # Alternate which configuration goes first, so neither always follows the other.
            order = kinds if round_index % 2 == 0 else kinds[::-1]
            for kind in order:
                for row in run_one(kind, model, args, Path(scratch)):
                    rows.append({"round": round_index, **row})
                    print(json.dumps(rows[-1]), flush=True)
    for kind, rate in itertools.product(kinds, args.rate.split(",")):
        mine = [r for r in rows if (r["config"], r["rate"]) == (kind, rate)]
        summary = {"summary": kind, "rate": rate}
        for key in ("request_throughput", "output_throughput", "ttft_p50_ms", "ttft_p99_ms"):
            summary[key] = statistics.mean(r[key] for r in mine)
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
