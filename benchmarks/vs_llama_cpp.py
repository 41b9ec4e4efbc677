"""Baton against llama.cpp's `llama-server` on the same random-weight Llama (F32 and Q8_0 GGUF
converted by llama.cpp's own converter), both driven by the same client, `baton bench`.

    PYTHONPATH=$PWD python benchmarks/vs_llama_cpp.py --preset bench \
        --prompt-len 40 256 --streams 1 8 32 --rounds 2 --json out.json --markdown out.md
    ... --baton-args "--quantization int8"    # a second Baton, its ratios against Q8_0
    ... --gguf q8_0 --baton-args "--quantization int8 --kv-cache-dtype float16"  # llama.cpp's
                                              # cache is float16 by default, Baton's the model's
    ... --f32-baton-args "--kv-cache-dtype float16"   # the Baton measured against F32 likewise
    ... --isa avx2      # both sides held to AVX2, FMA and F16C: an AVX2-only CPU's code paths
    PYTHONPATH=$PWD python benchmarks/vs_llama_cpp.py --pool a.json b.json  # runs' rounds together

One server runs at a time, started afresh for every shape (prompt length, streams) and sized
for it alike on both sides: as many sequences (llama.cpp slots) as streams, a context per
sequence that holds prompt and answer, the same CPU threads. Sides are interleaved within each
shape, in reverse order on odd rounds, so slow drift on a shared machine falls on all of them.
Each ratio is of the sides' medians over rounds, with the spread of the rounds' own ratios. The
JSON report goes to stdout, progress and the markdown table to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from llama_cpp_peer import ISAS, build, convert, llama_server_command, peers_dir
from vs_llama_cpp_report import (
    Measurement,
    as_json,
    markdown,
    ratios,
    renumbered,
    spreads,
    summarize,
    token_notes,
)

REPO = Path(__file__).resolve().parents[1]
BATON, BATON_VARIANT = "baton", "baton+args"
LLAMA_F32, LLAMA_Q8 = "llama.cpp F32", "llama.cpp Q8_0"
WARM_UP_PROMPT = "warm up"
# What `--isa` asks of Baton's side beyond the default: its C++ kernels built for that level
# (in a kernel folder of their own), and torch's own CPU dispatch (ATen's kernels, oneDNN, MKL)
# held to the same instructions. llama.cpp's side is a build for the same set (llama_cpp_peer).
BATON_ISA_ENV = {
    "native": {},
    "avx2": {
        "BATON_CPU_MARCH": "x86-64-v3",
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
}


@dataclass(frozen=True, slots=True)
class Side:
    """One server to measure: Baton on a checkpoint folder (`llama_server` None), or
    `llama_server` on a GGUF file."""

    name: str
    weights: Path
    llama_server: Path | None = None
    baton_args: tuple[str, ...] = ()
    # Environment the server gets beyond child_env's (another checkout's PYTHONPATH, say).
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Shape:
    """The workload of one measurement, and what both servers are sized for."""

    prompt_len: int
    streams: int
    output_len: int
    requests_per_stream: int

    @property
    def num_prompts(self) -> int:
        return max(4, self.streams * self.requests_per_stream)

    @property
    def context_per_sequence(self) -> int:
        """Prompt and answer with room to spare, a multiple of 128: `baton bench`'s words are
        about one token each (the report shows the exact counts)."""
        needed = self.prompt_len * 5 // 4 + self.output_len + 16
        return -(-needed // 128) * 128


def server_command(side: Side, shape: Shape, port: int, threads: int) -> list[str]:
    if side.llama_server is not None:
        return llama_server_command(
            side.llama_server,
            side.weights,
            port,
            slots=shape.streams,
            context_per_slot=shape.context_per_sequence,
            threads=threads,
        )
    return [
        *(sys.executable, "-m", "baton.app.cli", "serve", "--model", str(side.weights)),
        *("--host", "127.0.0.1", "--port", str(port), "--device", "cpu"),
        # Baton's step threads default to the cores it may use, not to OMP_NUM_THREADS.
        *("--cpu-threads", str(threads)),
        *("--max-num-seqs", str(shape.streams)),
        *("--max-model-len", str(shape.context_per_sequence)),
        *side.baton_args,
    ]


def bench_command(shape: Shape, port: int, seed: int) -> list[str]:
    """The same client and the same prompts (one seed) for every side."""
    return [
        *(sys.executable, "-m", "baton.app.cli", "bench", "--base-url", f"http://127.0.0.1:{port}"),
        *("--dataset", "random", "--input-len", str(shape.prompt_len)),
        *("--output-len", str(shape.output_len), "--ignore-eos"),
        *("--num-prompts", str(shape.num_prompts), "--max-concurrency", str(shape.streams)),
        *("--seed", str(seed), "--json"),
    ]


def child_env(threads: int, isa: str = "native") -> dict[str, str]:
    # torch's intra-op pool follows OMP_NUM_THREADS; llama-server gets --threads instead. Baton's
    # C++ kernels build into a folder of their own (unless one is set), so another checkout's
    # build on a shared machine neither invalidates this one's nor holds its lock mid-run; a
    # build for another instruction set into another folder beside it, for the same reason.
    kernels = os.environ.get("TORCH_EXTENSIONS_DIR") or str(peers_dir() / "torch-extensions")
    if isa != "native":
        kernels = f"{kernels}-{isa}"
    return (
        os.environ
        | {
            # This checkout first, then the caller's path: a worktree imports itself, not the
            # checkout the environment installed.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "OMP_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            "TORCH_EXTENSIONS_DIR": kernels,
        }
        | BATON_ISA_ENV[isa]
    )


def build_baton_kernels(threads: int, isa: str) -> None:
    """Baton's C++ CPU kernels built before any cold start is timed, as a deployed server finds
    them: torch's extension cache, in the servers' environment."""
    check = "import baton.kernels.cpu_extension as k; assert k.cpu_kernels_available()"
    env = child_env(threads, isa)
    subprocess.run([sys.executable, "-c", check], cwd=REPO, env=env, check=True)


def load_1min() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used (user and system, all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def anon_huge_mib(pid: int) -> float:
    """MiB of the process's anonymous memory on transparent huge pages."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def first_answer(server: subprocess.Popen, port: int, started: float, timeout_s: float) -> float:
    """Seconds from `started` until `server` answers a short completion (the warm-up, so
    neither side's first-request costs fall into the measurement)."""
    body = {"prompt": WARM_UP_PROMPT, "max_tokens": 8, "temperature": 0.0}
    base = f"http://127.0.0.1:{port}"
    while time.perf_counter() - started < timeout_s and server.poll() is None:
        left = timeout_s - (time.perf_counter() - started)
        try:
            # Baton accepts connections while it loads and answers once ready: wait for that
            # answer rather than poll, or the poll interval would add to its cold start.
            models = httpx.get(f"{base}/v1/models", timeout=httpx.Timeout(left, connect=1.0))
            if models.status_code == 200:
                body["model"] = models.json()["data"][0]["id"]
                reply = httpx.post(f"{base}/v1/completions", json=body, timeout=left)
                if reply.status_code != 200:
                    raise RuntimeError(f"warm-up answered {reply.status_code}: {reply.text[:200]}")
                return time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"no answer on port {port} within {timeout_s:.0f} s")


def measure(side: Side, shape: Shape, round_: int, args: argparse.Namespace) -> Measurement:
    """Start `side`'s server for `shape`, warm it up, run the client once, stop it."""
    env = child_env(args.threads, args.isa) | dict(side.env)
    name = side.name.replace(" ", "_").replace("/", "_")
    log_path = args.log_dir / f"{name}-{shape.prompt_len}-{shape.streams}-{round_}.log"
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", args.port)) == 0:
            # Another program's answers would be measured as this side's.
            raise RuntimeError(f"port {args.port} is taken: choose another with --port")
    load = load_1min()
    with log_path.open("w") as log:
        started = time.perf_counter()
        server = subprocess.Popen(
            server_command(side, shape, args.port, args.threads),
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            cold_start_s = first_answer(server, args.port, started, args.start_timeout)
            cpu_before = cpu_seconds(server.pid)
            bench = subprocess.run(
                bench_command(shape, args.port, args.seed),
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
            )
            rss = peak_rss_mib(server.pid)
            cpu_s = cpu_seconds(server.pid) - cpu_before
            huge = anon_huge_mib(server.pid)
        except RuntimeError as error:
            tail = "\n".join(log_path.read_text().splitlines()[-20:])
            raise RuntimeError(f"{side.name}: {error}; its log ends:\n{tail}") from None
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    # bench exits 1 when a request failed; the report counts those instead.
    result = json.loads(bench.stdout) if bench.stdout.strip() else {}
    if not result:
        raise RuntimeError(f"baton bench gave no report against {side.name}:\n{bench.stderr}")
    completed = max(result["completed"], 1)
    return Measurement(
        side=side.name,
        prompt_len=shape.prompt_len,
        streams=shape.streams,
        round=round_,
        output_tok_s=result["output_throughput"],
        ttft_p50_ms=result["median_ttft_ms"] or float("nan"),
        tpot_p50_ms=result["median_tpot_ms"] or float("nan"),
        completed=result["completed"],
        failed=result["failed"],
        prompt_tokens_per_request=result["total_input_tokens"] / completed,
        output_tokens_per_request=result["total_output_tokens"] / completed,
        cold_start_s=cold_start_s,
        peak_rss_mib=rss,
        load_1min=load,
        cpu_ms_per_token=cpu_s * 1e3 / max(result["total_output_tokens"], 1),
        anon_huge_mib=huge,
    )


def checkpoint(preset: str) -> Path:
    """A random-weight Llama of `baton.tools.random_checkpoint`'s `preset`, written once into the
    cache."""
    from baton.tools.random_checkpoint import write_checkpoint

    path = peers_dir() / "models" / f"llama-{preset}"
    if not (path / "config.json").is_file():
        partial = path.with_name(path.name + ".partial")
        write_checkpoint(partial, "llama", preset)
        partial.rename(path)
    return path


def sides(args: argparse.Namespace) -> list[Side]:
    model = Path(args.checkpoint) if args.checkpoint else checkpoint(args.preset)
    chosen = [Side(BATON, model, baton_args=tuple(shlex.split(args.f32_baton_args)))]
    if args.baton_args:
        chosen.append(Side(BATON_VARIANT, model, baton_args=tuple(shlex.split(args.baton_args))))
    for name, kind in ((LLAMA_F32, "f32"), (LLAMA_Q8, "q8_0")):
        if kind in args.gguf:
            gguf = convert(peers_dir(), model, peers_dir() / "gguf", kind)
            chosen.append(Side(name, gguf, llama_server=build(peers_dir(), isa=args.isa)))
    return chosen


def machine() -> dict:
    """The CPU's model name (as `lscpu` gives it) and its AVX2 and AVX-512 extensions."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags", "").split()
    vector = sorted(f for f in flags if f == "avx2" or f.startswith("avx512"))
    return {"cpu": fields.get("model name"), "cores": os.cpu_count(), "vector_flags": vector}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--preset", default="bench", help="baton.tools.random_checkpoint preset (Llama)"
    )
    parser.add_argument("--checkpoint", default=None, help="a Llama checkpoint folder instead")
    parser.add_argument("--prompt-len", type=int, nargs="+", default=[40, 256], help="words")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--requests-per-stream", type=int, default=2, help="at least 4 in all")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gguf", nargs="*", choices=["f32", "q8_0"], default=["f32", "q8_0"])
    parser.add_argument(
        "--f32-baton-args", default="", help="serve flags for the Baton measured against F32"
    )
    parser.add_argument(
        "--baton-args", default="", help="a second Baton with these serve flags, against Q8_0"
    )
    parser.add_argument(
        "--isa",
        choices=ISAS,
        default="native",
        help="the instructions both sides use: this CPU's own, or AVX2 without AVX-512",
    )
    parser.add_argument("--port", type=int, default=8179)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path, default=None, help="write the report here too")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here too")
    parser.add_argument("--log-dir", type=Path, default=None, help="server logs (default: cache)")
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        default=None,
        metavar="REPORT",
        help="measure nothing: the table of these earlier --json reports' rounds together",
    )
    return parser.parse_args(argv)


def run_rounds(
    chosen: list[Side], shapes: list[Shape], args: argparse.Namespace
) -> tuple[list[Measurement], list[str]]:
    """Every side on every shape, `args.rounds` times; the failures as notes."""
    measurements, failures = [], []
    for round_ in range(args.rounds):
        for shape in shapes:
            for side in chosen if round_ % 2 == 0 else chosen[::-1]:
                try:
                    m = measure(side, shape, round_, args)
                except RuntimeError as error:
                    # One server that fails to start or report costs its own cell, not the run.
                    failures.append(f"round {round_}, {shape}, {side.name}: {error}")
                    print(failures[-1], file=sys.stderr)
                    continue
                print(
                    f"round {round_} prompt {shape.prompt_len} streams {shape.streams} "
                    f"{side.name}: {m.output_tok_s:.1f} tok/s, TTFT {m.ttft_p50_ms:.0f} ms, "
                    f"TPOT {m.tpot_p50_ms:.1f} ms, CPU {m.cpu_ms_per_token:.2f} ms/token, "
                    f"{m.anon_huge_mib:.0f} MiB on huge pages (load {m.load_1min:.1f})",
                    file=sys.stderr,
                )
                measurements.append(m)
    return measurements, failures


def figures(measurements: list[Measurement], output_len: int) -> tuple[dict, str, list[str]]:
    """The report's figures of `measurements`: its JSON part, the markdown table and the
    notes on work the sides did not share."""
    summaries = summarize(measurements)
    ratio_rows = ratios(summaries, BATON, LLAMA_F32, measurements)
    ratio_rows += ratios(summaries, BATON_VARIANT, LLAMA_Q8, measurements)
    report = as_json(measurements, summaries) | {"ratios": ratio_rows}
    table = markdown(summaries, ratio_rows) + "\n\n" + spreads(summaries)
    return report, table, token_notes(summaries, output_len)


def pooled(paths: list[Path]) -> tuple[list[Measurement], int]:
    """The measurements of several earlier reports as one run's, and their output length
    (which they must share: their ratios would not be of the same work otherwise)."""
    reports = [json.loads(path.read_text()) for path in paths]
    lengths = {int(report["settings"]["output_len"]) for report in reports}
    if len(lengths) != 1:
        raise SystemExit(f"the reports measured different output lengths: {sorted(lengths)}")
    runs = [[Measurement(**m) for m in report["measurements"]] for report in reports]
    return renumbered(runs), lengths.pop()


def write(report: dict, table: str, args: argparse.Namespace) -> None:
    text = json.dumps(report, indent=2)
    print(text)
    print(table, *report["notes"], sep="\n", file=sys.stderr)
    if args.json:
        args.json.write_text(text + "\n")
    if args.markdown:
        args.markdown.write_text(table + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report: dict = {"command": shlex.join(sys.argv)}
    if args.pool:
        measurements, output_len = pooled(args.pool)
        report["pooled"] = [str(path) for path in args.pool]
        # What `pooled` reads back: a pooled report can be pooled again.
        report["settings"] = {"output_len": str(output_len)}
        figures_part, table, notes = figures(measurements, output_len)
        write(report | figures_part | {"notes": notes}, table, args)
        return
    args.log_dir = args.log_dir or peers_dir() / "logs"
    args.log_dir.mkdir(parents=True, exist_ok=True)
    chosen = sides(args)
    build_baton_kernels(args.threads, args.isa)
    shapes = [
        Shape(prompt_len, streams, args.output_len, args.requests_per_stream)
        for prompt_len in args.prompt_len
        for streams in args.streams
    ]
    report["machine"] = machine()
    report["settings"] = {key: str(value) for key, value in vars(args).items()}
    report["sides"] = {side.name: str(side.weights) for side in chosen}
    report["started"] = datetime.now(UTC).isoformat(timespec="seconds")
    report["loadavg_before"] = Path("/proc/loadavg").read_text().strip()
    measurements, failures = run_rounds(chosen, shapes, args)
    report["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    report["loadavg_after"] = Path("/proc/loadavg").read_text().strip()
    figures_part, table, notes = figures(measurements, args.output_len)
    write(report | figures_part | {"notes": notes + failures}, table, args)


if __name__ == "__main__":
    main()
