"""Cold start: seconds from launching `baton serve` to its first answered /v1/completions
request, and the server's memory then (resident set, and its peak so far), over several runs.

    python benchmarks/cold_start.py                          # the demo model on the CPU, 5 runs
    python benchmarks/cold_start.py --runs 9 -- --kv-cache-memory 64MiB
    python benchmarks/cold_start.py --llama-server PATH --gguf FILE   # llama.cpp too, interleaved
    python benchmarks/cold_start.py --baton-root ../main               # another checkout's Baton
    python benchmarks/cold_start.py --torch-floor                      # and `import torch` alone

Arguments after `--` go to `baton serve`; `--llama-arg` (repeatable; `--llama-arg=-c
--llama-arg=2048` for values that start with a dash) to llama-server. The client
polls every 10 ms with a raw HTTP request (refused until the server listens, 503 while a
llama-server loads) and stops the server with SIGINT once it has answered. Prints one JSON
object: per server, min/median/max of each figure and every run's own.

With `--torch-floor` each round also times a Python that only imports torch, to the moment the
import is done, and reads its memory then: no torch server can start sooner or hold less. The
report then gives Baton's own share too, each run's figures less the floor's of its round.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.01


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answered(port: int, body: bytes) -> bool:
    """Whether the server at `port` answered one completion (False while it cannot yet)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        connection.close()


def memory_bytes(pid: int) -> tuple[int, int]:
    """(resident set, its peak) of process `pid`, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def one_run(
    command: list[str], body: bytes, port: int, timeout_s: float, root: Path
) -> dict[str, float]:
    """Launch `command` in `root` (serving on `port`), time it to its first answer, stop it."""
    # The log goes to a file, not a pipe: a pipe nobody reads would stall a chatty server.
    with tempfile.TemporaryFile("w+") as log:
        start = time.perf_counter()
        process = subprocess.Popen(
            command,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            while not answered(port, body):
                if process.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(
                        f"{command[0]} exited with {process.returncode}:\n{log.read()[-2000:]}"
                    )
                if time.perf_counter() - start > timeout_s:
                    raise RuntimeError(f"{command[0]} did not answer within {timeout_s} s")
                time.sleep(POLL_S)
            ready_s = time.perf_counter() - start
            rss, peak = memory_bytes(process.pid)
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return {"ready_s": ready_s, "rss_mib": rss / 2**20, "peak_rss_mib": peak / 2**20}


# Starts Python, imports torch, and prints its resident set and that set's peak, in kB.
FLOOR_SCRIPT = (
    "import torch\n"
    "from pathlib import Path\n"
    "kb = dict(line.split()[:2] for line in Path('/proc/self/status').read_text().splitlines()"
    " if line.startswith(('VmRSS:', 'VmHWM:')))\n"
    "print(kb['VmRSS:'], kb['VmHWM:'], flush=True)\n"
)


def torch_floor(root: Path) -> dict[str, float]:
    """Seconds from launching Python to `import torch` done, and the memory it then holds (the
    same keys as a server's run)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-c", FLOOR_SCRIPT], cwd=root, stdout=subprocess.PIPE, text=True
    )
    line = process.stdout.readline()
    ready_s = time.perf_counter() - start
    process.wait()
    if process.returncode != 0 or not line:
        raise RuntimeError(f"importing torch failed with {process.returncode}")
    rss_kb, peak_kb = (int(field) for field in line.split())
    return {"ready_s": ready_s, "rss_mib": rss_kb / 1024, "peak_rss_mib": peak_kb / 1024}


def above(runs: list[dict[str, float]], floors: list[dict[str, float]]) -> list[dict[str, float]]:
    """Each run's figures less those of the floor measured in the same round."""
    return [
        {key: run[key] - floor[key] for key in run} for run, floor in zip(runs, floors, strict=True)
    ]


def summary(runs: list[dict[str, float]]) -> dict[str, object]:
    figures = {}
    for key in runs[0]:
        values = [run[key] for run in runs]
        figures[key] = {
            "min": round(min(values), 3),
            "median": round(statistics.median(values), 3),
            "max": round(max(values), 3),
        }
    return {"runs": len(runs), **figures, "each": runs}


def baton_command(port: int, model: str | None, extra: list[str]) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "baton.app.cli",
        "serve",
        "--device",
        "cpu",
        "--port",
        str(port),
    ]
    return command + (["--model", model] if model else []) + extra


def llama_command(binary: str, gguf: str, port: int, extra: list[str]) -> list[str]:
    return [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), *extra]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the demo)")
    parser.add_argument("--prompt", default="Hello, how are you?")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per start")
    parser.add_argument(
        "--baton-root", type=Path, default=ROOT, help="the source tree Baton runs from"
    )
    parser.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary")
    parser.add_argument("--gguf", default=None, help="the GGUF file llama-server loads")
    parser.add_argument("--llama-arg", action="append", default=[])
    parser.add_argument(
        "--torch-floor", action="store_true", help="time `import torch` alone in each round too"
    )
    parser.add_argument("baton_args", nargs="*", help="after --: flags for baton serve")
    args = parser.parse_args()
    if (args.llama_server is None) != (args.gguf is None):
        parser.error("--llama-server and --gguf go together")
    body = json.dumps(
        {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": 0}
    ).encode()
    results: dict[str, list[dict[str, float]]] = {"baton": []}
    if args.llama_server:
        results["llama.cpp"] = []
    if args.torch_floor:
        results["import torch"] = []
    # Interleaved, so a noisy neighbour on a shared machine weighs on both alike.
    for _ in range(args.runs):
        port = free_port()
        command = baton_command(port, args.model, args.baton_args)
        results["baton"].append(one_run(command, body, port, args.timeout, args.baton_root))
        if args.llama_server:
            port = free_port()
            command = llama_command(args.llama_server, args.gguf, port, args.llama_arg)
            results["llama.cpp"].append(one_run(command, body, port, args.timeout, ROOT))
        if args.torch_floor:
            results["import torch"].append(torch_floor(args.baton_root))
    if args.torch_floor:
        results["baton above import torch"] = above(results["baton"], results["import torch"])
    print(json.dumps({name: summary(runs) for name, runs in results.items()}, indent=2))


if __name__ == "__main__":
    main()
