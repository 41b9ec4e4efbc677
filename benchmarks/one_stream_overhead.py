"""What serving adds to one stream's decode step on the CPU: the engine alone against
`baton serve` driven by `baton bench`, interleaved, with the CPU each thread spends a token.

    python benchmarks/one_stream_overhead.py --model DIR             # 5 rounds, 256-word prompts
    python benchmarks/one_stream_overhead.py --model DIR --prompt-len 40 --rounds 7
    python benchmarks/one_stream_overhead.py --model DIR --compare ../main  # 2 checkouts

The engine alone is built as `baton serve` builds it (same flags, the step-cost profile) and
steps on a thread of its own as the step loop does, so the two sides differ only in what
serving adds: the event loop's work per token, the hop between the threads, and the client,
which on a machine with as many cores as torch has threads competes with the forward for them.
Each round runs each side once (the order alternates); the server stays up between rounds.
For a server run the report also gives CPU milliseconds per generated token of its event-loop
thread, its busiest other thread (the step thread) and the rest (torch's OpenMP workers), and
of the client process (less its start-up): on a loaded machine these say more than wall time.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_LEN = 128
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def thread_cpu_ms(pid: int) -> dict[int, float]:
    """CPU time (user + system) of each thread of process `pid` so far."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended between the listing and the read
        fields = stat[stat.rindex(")") + 2 :].split()
        times[int(task.name)] = (int(fields[11]) + int(fields[12])) * TICK_MS
    return times


def engine_child(serve_args: list[str]) -> None:
    """Child process: the engine alone. Reads a prompt length per line on stdin, generates
    OUTPUT_LEN greedy tokens for a random prompt of that length on a thread, and prints the
    milliseconds per token after the first."""
    from baton.app.cli import build_parser, serving_model
    from baton.core.request import EngineRequest
    from baton.core.sampling_params import SamplingParams

    args = build_parser().parse_args(["serve", *serve_args])
    engine = serving_model(args).build_engine()
    rng = random.Random(0)
    params = SamplingParams(max_tokens=OUTPUT_LEN, temperature=0.0, ignore_eos=True)

    def generate(prompt_len: int, result: list[float]) -> None:
        prompt = [rng.randrange(engine.vocab_size) for _ in range(prompt_len)]
        request = EngineRequest(f"r{time.monotonic_ns()}", prompt, params)
        engine.add_request(engine.validator.validate(request))
        token_times = []
        while engine.has_unfinished_requests:
            if engine.step():
                token_times.append(time.perf_counter())
        result.append((token_times[-1] - token_times[0]) / (len(token_times) - 1) * 1e3)

    gc.freeze()  # as the step loop does
    for line in itertools.chain(["16"], sys.stdin):
        result: list[float] = []
        # A thread of its own, as in the server: which thread calls torch matters to OpenMP.
        worker = threading.Thread(target=generate, args=(int(line), result))
        worker.start()
        worker.join()
        print(f"{result[0]:.4f}", flush=True)


def child_env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


class Server:
    """`baton serve` from the checkout at `root`, warmed up."""

    def __init__(self, root: Path, serve_args: list[str], log: Path) -> None:
        self.root = root
        self.port = free_port()
        env = os.environ | {"PYTHONPATH": str(root), "TOKENIZERS_PARALLELISM": "false"}
        command = [sys.executable, "-m", "baton.app.cli", "serve", "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", *serve_args],
            cwd=root,
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        while self.bench(40, num_prompts=1) is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {root} did not answer; see {log}")
            time.sleep(0.5)

    def bench(self, prompt_len: int, num_prompts: int, output_len: int = OUTPUT_LEN) -> dict | None:
        command = [
            *(sys.executable, "-m", "baton.app.cli", "bench", "--base-url"),
            *(f"http://127.0.0.1:{self.port}", "--dataset", "random"),
            *("--input-len", str(prompt_len), "--output-len", str(output_len), "--ignore-eos"),
            *("--num-prompts", str(num_prompts), "--max-concurrency", "1", "--json"),
        ]
        done = subprocess.run(
            command,
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not done.stdout.strip():
            return None
        return json.loads(done.stdout)

    def client_start_cpu_ms(self) -> float:
        """The client's CPU for a one-token request: its start-up, taken off its per-token CPU."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.bench(4, num_prompts=1, output_len=1)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e3

    def measure(self, prompt_len: int, num_prompts: int) -> dict[str, float]:
        """One bench run: TPOT p50, output tok/s and CPU ms per token by thread and client."""
        client_start_ms = self.client_start_cpu_ms()
        before = thread_cpu_ms(self.process.pid)
        client_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = self.bench(prompt_len, num_prompts)
        client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        after = thread_cpu_ms(self.process.pid)
        if result is None:
            raise RuntimeError(f"baton bench failed against the server at {self.root}")
        tokens = result["completed"] * OUTPUT_LEN
        spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
        loop_ms = spent.pop(self.process.pid, 0.0)
        step_ms = max(spent.values(), default=0.0)
        client_s = sum(
            getattr(client_after, f) - getattr(client_before, f) for f in ("ru_utime", "ru_stime")
        )
        return {
            "tpot_ms": result["median_tpot_ms"],
            "tok_s": result["output_throughput"],
            "cpu_event_loop": loop_ms / tokens,
            "cpu_step_thread": step_ms / tokens,
            "cpu_other_threads": (sum(spent.values()) - step_ms) / tokens,
            "cpu_client": (client_s * 1e3 - client_start_ms) / tokens,
        }

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def load_1min() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint folder")
    parser.add_argument("--prompt-len", type=int, default=256, help="prompt words")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-prompts", type=int, default=2, help="requests per server run")
    parser.add_argument("--compare", type=Path, help="another checkout, served alongside")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--child-engine", action="store_true", help=argparse.SUPPRESS)
    # Unknown arguments are `baton serve` flags for both sides.
    args, extra = parser.parse_known_args()
    extra = extra or ["--max-model-len", "512"]
    serve_args = ["--model", args.model, "--device", "cpu", "--max-num-seqs", "1", *extra]
    if args.child_engine:
        engine_child(serve_args)
        return
    engine = subprocess.Popen(
        [sys.executable, __file__, "--child-engine", "--model", args.model, *extra],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    engine.stdout.readline()  # its warm-up generation
    roots = {"served": ROOT} | ({"compare": args.compare.resolve()} if args.compare else {})
    servers = {
        name: Server(root, serve_args, args.log_dir / f"one_stream_{name}.log")
        for name, root in roots.items()
    }
    # Bench words are about one token each, plus the template's few.
    prompt_tokens = args.prompt_len + args.prompt_len // 20

    def run_engine() -> dict[str, float]:
        engine.stdin.write(f"{prompt_tokens}\n")
        engine.stdin.flush()
        return {"tpot_ms": float(engine.stdout.readline())}

    sides = {"engine": run_engine} | {
        name: (lambda s=server: s.measure(args.prompt_len, args.num_prompts))
        for name, server in servers.items()
    }
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    loads = []
    try:
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
            loads.append(load_1min())
            for name in order:
                rows[name].append(sides[name]())
            cells = "  ".join(f"{name} {rows[name][-1]['tpot_ms']:.2f}" for name in sides)
            print(f"round {round_}: ms/token {cells}  load {loads[-1]}", file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()
        engine.stdin.close()
        engine.wait(timeout=60)
    summary = {
        name: {key: statistics.median(row[key] for row in runs) for key in runs[0]}
        for name, runs in rows.items()
    }
    summary["load_1min"] = {"min": min(loads), "max": max(loads)}
    summary["runs"] = rows
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
