"""Baton beside a busy neighbour: its output tokens/s with a busy loop pinned to one of its cores
against the same without, and llama.cpp's `llama-server` on the same weights (F32 GGUF) under the
same neighbour, both driven by `baton bench` (benchmarks/vs_llama_cpp.py's servers and client).

    PYTHONPATH=$PWD python benchmarks/neighbours.py --streams 1 8 --rounds 2
    ... --compare-pythonpath /other/checkout    # that checkout's Baton too, interleaved
    ... --no-llama-cpp                          # Baton alone

Every side runs every shape quiet and beside the neighbour, interleaved (reversed on odd rounds),
each a fresh server. The neighbour is a Python busy loop pinned (sched_setaffinity) to the last
core this process may use, started before the server and killed after it. The report, per side
and shape: the median tok/s and TPOT of the rounds quiet and beside it, the share of its quiet
throughput a side keeps, and each Baton's tok/s over llama.cpp's beside the neighbour. Targets
(issue 44): Baton keeps at least 40% at 1 and 8 streams, and beats llama.cpp beside the
neighbour. The JSON report goes to stdout, the markdown table to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from llama_cpp_peer import build, convert, peers_dir
from vs_llama_cpp import (
    BATON,
    LLAMA_F32,
    Measurement,
    Shape,
    Side,
    build_baton_kernels,
    checkpoint,
    machine,
    measure,
)

QUIET, BESIDE = "quiet", "neighbour"
# Ends with its parent, should the benchmark be killed before it kills the loop.
BUSY_LOOP = (
    "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nparent = os.getppid()\n"
    "while os.getppid() == parent:\n    pass\n"
)


@contextlib.contextmanager
def neighbour(core: int | None) -> Iterator[None]:
    """A busy loop pinned to `core` while the block runs; nothing where `core` is None."""
    if core is None:
        yield
        return
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(core)])
    try:
        yield
    finally:
        busy.kill()
        busy.wait()


def neighbour_core() -> int:
    """The core the neighbour takes: the last of those this process may use."""
    return max(os.sched_getaffinity(0))


def chosen_sides(args: argparse.Namespace) -> list[Side]:
    model = Path(args.checkpoint) if args.checkpoint else checkpoint(args.preset)
    baton_args = tuple(shlex.split(args.baton_args))
    chosen = [Side(BATON, model, baton_args=baton_args)]
    for path in args.compare_pythonpath:
        env = (("PYTHONPATH", path),)
        chosen.append(Side(f"baton ({path})", model, baton_args=baton_args, env=env))
    if args.llama_cpp:
        gguf = convert(peers_dir(), model, peers_dir() / "gguf", "f32")
        chosen.append(Side(LLAMA_F32, gguf, llama_server=build(peers_dir())))
    return chosen


def run_rounds(
    sides: list[Side], shapes: list[Shape], args: argparse.Namespace
) -> tuple[list[tuple[str, Measurement]], list[str]]:
    """(condition, measurement) for every side, shape and condition, `args.rounds` times; the
    failures as notes."""
    runs = [(side, condition) for side in sides for condition in (QUIET, BESIDE)]
    core = neighbour_core()
    results, failures = [], []
    for round_ in range(args.rounds):
        for shape in shapes:
            for side, condition in runs if round_ % 2 == 0 else runs[::-1]:
                try:
                    with neighbour(core if condition == BESIDE else None):
                        m = measure(side, shape, round_, args)
                except RuntimeError as error:
                    failures.append(f"round {round_}, {shape}, {side.name} {condition}: {error}")
                    print(failures[-1], file=sys.stderr)
                    continue
                print(
                    f"round {round_} streams {shape.streams} {side.name} {condition}: "
                    f"{m.output_tok_s:.1f} tok/s, TPOT {m.tpot_p50_ms:.1f} ms "
                    f"(load {m.load_1min:.1f})",
                    file=sys.stderr,
                )
                results.append((condition, m))
    return results, failures


def summary(results: list[tuple[str, Measurement]], sides: list[Side]) -> list[dict]:
    """Per side and shape, the medians over rounds quiet and beside the neighbour, the share
    kept, and (for a Baton) its tok/s over llama.cpp's beside the neighbour."""
    cells: dict[tuple[str, int, int, str], list[Measurement]] = {}
    for condition, m in results:
        cells.setdefault((m.side, m.prompt_len, m.streams, condition), []).append(m)

    def median(key: tuple[str, int, int, str], field: str) -> float:
        values = [getattr(m, field) for m in cells.get(key, [])]
        return statistics.median(values) if values else float("nan")

    rows = []
    shapes = sorted({(prompt_len, streams) for _, prompt_len, streams, _ in cells})
    for prompt_len, streams in shapes:
        peer = median((LLAMA_F32, prompt_len, streams, BESIDE), "output_tok_s")
        for side in sides:
            quiet = median((side.name, prompt_len, streams, QUIET), "output_tok_s")
            beside = median((side.name, prompt_len, streams, BESIDE), "output_tok_s")
            rows.append(
                {
                    "side": side.name,
                    "prompt_len": prompt_len,
                    "streams": streams,
                    "quiet_tok_s": quiet,
                    "neighbour_tok_s": beside,
                    "kept": beside / quiet,
                    "quiet_tpot_ms": median((side.name, prompt_len, streams, QUIET), "tpot_p50_ms"),
                    "neighbour_tpot_ms": median(
                        (side.name, prompt_len, streams, BESIDE), "tpot_p50_ms"
                    ),
                    "over_llama_cpp_beside": (
                        beside / peer if side.llama_server is None else float("nan")
                    ),
                }
            )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| side | prompt | streams | quiet tok/s | neighbour tok/s | kept | TPOT quiet ms "
        "| TPOT neighbour ms | / llama.cpp beside |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['side']} | {r['prompt_len']} | {r['streams']} | {r['quiet_tok_s']:.1f} "
            f"| {r['neighbour_tok_s']:.1f} | {r['kept']:.0%} | {r['quiet_tpot_ms']:.1f} "
            f"| {r['neighbour_tpot_ms']:.1f} | {r['over_llama_cpp_beside']:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--preset", default="bench", help="baton.tools.random_checkpoint preset (Llama)"
    )
    parser.add_argument("--checkpoint", default=None, help="a Llama checkpoint folder instead")
    parser.add_argument("--prompt-len", type=int, default=40, help="words")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--requests-per-stream", type=int, default=1, help="at least 4 in all")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--baton-args", default="", help="serve flags for every Baton")
    parser.add_argument(
        "--compare-pythonpath",
        nargs="*",
        default=[],
        metavar="PATH",
        help="also a Baton whose server imports baton from PATH (another checkout)",
    )
    parser.add_argument("--llama-cpp", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--port", type=int, default=8181)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--log-dir", type=Path, default=None, help="server logs (default: cache)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here too")
    args = parser.parse_args(argv)
    args.isa = "native"  # what vs_llama_cpp.measure reads
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.log_dir = args.log_dir or peers_dir() / "logs"
    args.log_dir.mkdir(parents=True, exist_ok=True)
    sides = chosen_sides(args)
    build_baton_kernels(args.threads, args.isa)
    shapes = [
        Shape(args.prompt_len, streams, args.output_len, args.requests_per_stream)
        for streams in args.streams
    ]
    report: dict = {
        "command": shlex.join(sys.argv),
        "machine": machine(),
        "neighbour_core": neighbour_core(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg_before": Path("/proc/loadavg").read_text().strip(),
    }
    results, failures = run_rounds(sides, shapes, args)
    rows = summary(results, sides)
    report |= {
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg_after": Path("/proc/loadavg").read_text().strip(),
        "rows": rows,
        "measurements": [{"condition": c} | dataclasses.asdict(m) for c, m in results],
        "failures": failures,
    }
    text = json.dumps(report, indent=2)
    print(text)
    print(markdown(rows), *failures, sep="\n", file=sys.stderr)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
