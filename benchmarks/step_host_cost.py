"""The engine's host work per decode step (everything but the model's forward and LM head) at
1 and 8 streams on the CPU, for one checkout or two interleaved.

    python benchmarks/step_host_cost.py --model DIR                      # 1 and 8 streams
    python benchmarks/step_host_cost.py --model DIR --compare ../main    # two checkouts
    python benchmarks/step_host_cost.py --model DIR --streams 1 8 64 --rounds 7

Each checkout runs in a child process that builds the engine as `baton serve` does (int8 by
default; extra arguments are `baton serve` flags) and steps it on a thread of its own, as the
step loop does. The model sits behind a proxy that times its forward and LM head; a step's host
cost is its wall time minus theirs, and its CPU time (of the stepping thread) minus theirs.
With `--fake-forward` it returns constant tensors of the right shapes instead of running the
model, so every microsecond left is host work: the figure with the least noise on a loaded
machine. `--no-cost-fit` takes the step-cost model's refit out of the step listeners, to show
what it costs. Rounds alternate the order of the checkouts; the report gives medians and spread
per step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROMPT_LEN = 16


class TimedModel:
    """Stands in for the executor's model: times (or, `fake`, skips) the forward and LM head."""

    def __init__(self, model: Any, fake: bool) -> None:
        self.model = model
        self.fake = fake
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self._outputs: dict[tuple[int, int], Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, input_ids: Any, *args: Any) -> Any:
        return self._timed(self.model, (input_ids, *args), self.model.config.hidden_size)

    def compute_logits(self, hidden: Any) -> Any:
        return self._timed(self.model.compute_logits, (hidden,), self.model.config.vocab_size)

    def timed_forward(self, forward: Any) -> Any:
        """`forward` (another way to the model's hidden states) timed, or skipped, as a call."""
        hidden_size = self.model.config.hidden_size
        return lambda input_ids, *args: self._timed(forward, (input_ids, *args), hidden_size)

    def _timed(self, function: Any, args: tuple[Any, ...], width: int) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        if self.fake:
            import torch

            shape = (args[0].shape[0], width)
            if shape not in self._outputs:
                # One column above the rest: the token sampled is an ordinary one, which the
                # detokenizer decodes as it would a real model's.
                self._outputs[shape] = torch.zeros(shape)
                self._outputs[shape][:, width // 2] = 1.0
            result = self._outputs[shape]
        else:
            result = function(*args)
        self.cpu_s += time.thread_time() - cpu
        self.wall_s += time.perf_counter() - wall
        return result


def measure(engine: Any, model: TimedModel, streams: int, steps: int) -> dict[str, float]:
    """Decode `steps` tokens in each of `streams` requests; medians per decode step, in ms."""
    from baton.core.request import EngineRequest
    from baton.core.sampling_params import SamplingParams

    rng = random.Random(streams)
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    for i in range(streams):
        prompt = [rng.randrange(engine.vocab_size) for _ in range(PROMPT_LEN)]
        engine.add_request(EngineRequest(f"s{streams}-{i}-{time.monotonic_ns()}", prompt, params))
    engine.step()  # the prefill
    host_ms, cpu_ms, step_ms = [], [], []
    while engine.has_unfinished_requests:
        model.wall_s = model.cpu_s = 0.0
        wall, cpu = time.perf_counter(), time.thread_time()
        engine.step()
        step_s = time.perf_counter() - wall
        host_ms.append((step_s - model.wall_s) * 1e3)
        cpu_ms.append((time.thread_time() - cpu - model.cpu_s) * 1e3)
        step_ms.append(step_s * 1e3)
    return {
        "host_ms": statistics.median(host_ms),
        "host_cpu_ms": statistics.median(cpu_ms),
        "step_ms": statistics.median(step_ms),
    }


def child(model_dir: str, serve_args: list[str], steps: int, fake: bool, cost_fit: bool) -> None:
    """Child process: reads a stream count per line, prints one `measure` as JSON."""
    from baton.app.cli import build_parser, serving_model

    engines: dict[int, tuple[Any, TimedModel]] = {}

    def engine_for(streams: int) -> tuple[Any, TimedModel]:
        if streams not in engines:
            flags = ["--model", model_dir, "--max-num-seqs", str(streams), *serve_args]
            engine = serving_model(build_parser().parse_args(["serve", *flags])).build_engine()
            timed = TimedModel(engine.executor.model, fake)
            engine.executor.model = timed
            layers = engine.executor.cpu_layers
            if layers is not None:
                # CPU decode steps run the decoder layers in one C++ call, past the model.
                layers.forward = timed.timed_forward(layers.forward)
            if not cost_fit:
                engine.step_listeners.remove(engine.step_cost_model.observe)
            engines[streams] = (engine, timed)
            gc.freeze()  # as the step loop does
        return engines[streams]

    results: list[dict[str, float]] = []
    for line in sys.stdin:
        streams = int(line)
        engine, timed = engine_for(streams)
        for num_steps in (8, steps):  # a warm-up at this count, then the measurement
            # A thread of its own, as in the server: which thread calls torch matters to OpenMP.
            worker = threading.Thread(
                target=lambda *args: results.append(measure(*args)),
                args=(engine, timed, streams, num_steps),
            )
            worker.start()
            worker.join()
        print(json.dumps(results[-1]), flush=True)


class Side:
    """One checkout's child process."""

    def __init__(self, root: Path, argv: list[str]) -> None:
        env = os.environ | {"PYTHONPATH": str(root), "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--child", *argv],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def measure(self, streams: int) -> dict[str, float]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{streams}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the benchmark child died; run it alone to see why")
        return json.loads(line)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint folder")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--steps", type=int, default=128, help="decode steps per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fake-forward", action="store_true", help="skip the model (host only)")
    parser.add_argument(
        "--no-cost-fit", action="store_true", help="without the step-cost model's refit per step"
    )
    parser.add_argument("--compare", type=Path, help="another checkout, measured alongside")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    # Unknown arguments are `baton serve` flags for both sides.
    args, extra = parser.parse_known_args()
    serve_args = ["--device", "cpu", *(extra or ["--quantization", "int8"])]
    if args.child:
        child(args.model, serve_args, args.steps, args.fake_forward, not args.no_cost_fit)
        return
    argv = ["--model", args.model, "--steps", str(args.steps), *serve_args]
    argv += ["--fake-forward"] if args.fake_forward else []
    argv += ["--no-cost-fit"] if args.no_cost_fit else []
    roots = {"this": ROOT} | ({"compare": args.compare.resolve()} if args.compare else {})
    sides = {name: Side(root, argv) for name, root in roots.items()}
    runs: dict[str, dict[int, list[dict[str, float]]]] = {
        name: {n: [] for n in args.streams} for name in sides
    }
    loads = []
    try:
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
            loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
            for streams in args.streams:
                for name in order:
                    runs[name][streams].append(sides[name].measure(streams))
                cells = "  ".join(
                    f"{name} {runs[name][streams][-1]['host_ms']:.3f}" for name in sides
                )
                print(f"round {round_} streams {streams}: host ms {cells}", file=sys.stderr)
    finally:
        for side in sides.values():
            side.close()
    summary: dict[str, Any] = {
        name: {
            streams: {
                key: {
                    "median": statistics.median(r[key] for r in rows),
                    "min": min(r[key] for r in rows),
                    "max": max(r[key] for r in rows),
                }
                for key in rows[0]
            }
            for streams, rows in by_streams.items()
        }
        for name, by_streams in runs.items()
    }
    summary["load_1min"] = {"min": min(loads), "max": max(loads)}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
