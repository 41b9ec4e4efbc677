"""Serving with replicas on this machine (issue 16), `baton bench` driving real servers,
configurations interleaved round by round so a shared machine's drift hits each alike.

    python benchmarks/replica_serving.py threads --rounds 2
    python benchmarks/replica_serving.py overhead --rounds 2

`threads`: the bench model (gpu.random_checkpoint's `bench` preset) served by `baton serve`
as 1 replica with 2 torch threads (the single-process server) and as 2 replicas with 1 thread
each (`--replicas 2 --replica-cpus 1`: Ray gives each actor OMP_NUM_THREADS=1), at one open-
loop request rate: throughput and TTFT. `overhead`: the tiny model, where the forward costs
least, as the single-process server and as one and two Ray replicas behind the front end, every
stream at once: the per-token cost of the replica path (one Ray message per step, the follower
task, the ledger) against the single-process server, and the front end's time per request in
the replica path's own work: the admission forecast over every replica (`forecast_ttft`) and
routing plus the submit (`_send`: hashing the prompt's blocks, the router, the ledger, the
actor call), timed inside the server. One JSON line per run, then a summary per configuration.
"""

from __future__ import annotations

import argparse
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

from core.latency import percentile

HEALTH_WAIT_S = 600.0


def serve_command(kind: str, model: str, port: int, timings: str) -> tuple[list[str], dict]:
    """The server for one configuration, and its environment."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # Ray sets it per actor from --replica-cpus
    # A TTFT target for every request, far above what it takes, so admission asks the
    # forecast (over every replica, with replicas) and refuses nothing.
    engine = ["--device", "cpu", "--port", str(port), "--max-num-seqs", "32"]
    engine += ["--ttft-slo-ms", "600000"]
    if kind == "1x2":
        env["OMP_NUM_THREADS"] = "2"
        return [sys.executable, "-m", "app.cli", "serve", "--model", model, *engine], env
    if kind == "2x1":
        flags = ["--replicas", "2", "--replica-cpus", "1"]
        return [sys.executable, "-m", "app.cli", "serve", "--model", model, *engine, *flags], env
    if kind == "single":
        return [sys.executable, "-m", "app.cli", "serve", "--model", model, *engine], env
    # "ray-1" / "ray-2": `baton serve --replicas N`'s own code, with the front end timed.
    replicas = kind.split("-")[1]
    child = [sys.executable, __file__, "serve-timed", "--model", model, "--port", str(port)]
    return [*child, "--replicas", replicas, "--timings", timings], env


def serve_timed(args: argparse.Namespace) -> None:
    """Child: `baton serve --replicas N` (app/replica_server.py's steps), with the front end's
    replica work per request timed; the timings go to `--timings` when the server stops."""
    import ray

    from app.replica_server import start_replicas
    from app.replica_settings import ReplicaModel, ReplicaSettings
    from app.server import serve_front_end
    from app.settings import ServerSettings
    from core.config import EngineConfig
    from core.tokenizer import Tokenizer

    cpus = 2 / args.replicas
    config = EngineConfig(max_num_seqs=32, ttft_slo_ms=600_000)
    spec = ReplicaModel(args.model, config, device="cpu")
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
            ServerSettings(port=args.port),
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


def bench(port: int, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        "-m",
        "app.cli",
        "bench",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--dataset",
        "random",
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--num-prompts",
        str(args.num_prompts),
        "--request-rate",
        str(args.rate),
        "--ignore-eos",
        "--seed",
        "0",
        "--json",
    ]
    if args.max_concurrency:
        command += ["--max-concurrency", str(args.max_concurrency)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def run_one(kind: str, model: str, args: argparse.Namespace, scratch: Path) -> dict:
    timings = scratch / f"timings-{kind}.json"
    command, env = serve_command(kind, model, args.port, str(timings))
    started = time.monotonic()
    with open(scratch / f"serve-{kind}.log", "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(args.port, server)
            ready_s = time.monotonic() - started
            summary = bench(args.port, args)
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()
    row = {
        "config": kind,
        "ready_s": round(ready_s, 1),
        "load_average": os.getloadavg()[0],
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
    if timings.exists():
        for name, values in json.loads(timings.read_text()).items():
            if not values:
                continue
            values.sort()
            row[f"{name}_us_p50"] = percentile(values, 50) * 1e6
            row[f"{name}_us_p99"] = percentile(values, 99) * 1e6
            row[f"{name}_calls"] = len(values)
    return row


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
    from gpu.random_checkpoint import write_checkpoint

    return str(write_checkpoint(scratch / preset, "llama", preset))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["threads", "overhead", "serve-timed"])
    parser.add_argument("--model", default=None, help="checkpoint (default: a random one)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8431)
    parser.add_argument("--rate", default=None, help="requests per second (inf: all at once)")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--input-len", type=int, default=None, help="prompt words")
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--timings", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode == "serve-timed":
        serve_timed(args)
        return
    threads = args.mode == "threads"
    defaults = (
        {"rate": "2", "num_prompts": 80, "input_len": 64, "output_len": 64}
        if threads
        else {"rate": "inf", "num_prompts": 96, "input_len": 16, "output_len": 128}
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    kinds = ["1x2", "2x1"] if threads else ["single", "ray-1", "ray-2"]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or checkpoint("bench" if threads else "tiny", Path(scratch))
        for round_index in range(args.rounds):
            # Alternate which configuration goes first, so neither always follows the other.
            order = kinds if round_index % 2 == 0 else kinds[::-1]
            for kind in order:
                row = {"round": round_index, **run_one(kind, model, args, Path(scratch))}
                rows.append(row)
                print(json.dumps(row), flush=True)
    for kind in kinds:
        mine = [r for r in rows if r["config"] == kind]
        summary = {"summary": kind}
        for key in ("request_throughput", "output_throughput", "ttft_p50_ms", "ttft_p99_ms"):
            summary[key] = statistics.mean(r[key] for r in mine)
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
