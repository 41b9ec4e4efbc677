"""The decode step with its decoder layers in one C++ call against the same layers run from
Python, in one engine, interleaved: the engine as `baton serve` builds it, stepping on a thread
of its own as the step loop does.

    python benchmarks/one_call_decode.py --model DIR                      # float32, 1 and 8 streams
    python benchmarks/one_call_decode.py --model DIR --streams 1 --rounds 6 -- --quantization int8

Arguments after `--` go to the engine as `baton serve` flags. Each round runs both sides once
(the order alternating) over the same number of streams: 40-token prompts, then the median
wall time of the decode-only steps of 64 greedy tokens. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

PROMPT_TOKENS = 40
OUTPUT_TOKENS = 64


def measure(model: str, streams: int, rounds: int, serve_args: list[str]) -> dict:
    """Median decode-step ms of each side, per round and over the rounds."""
    from baton.app.cli import build_parser, serving_model
    from baton.core.request import EngineRequest
    from baton.core.sampling_params import SamplingParams

    serve = ["serve", "--model", model, "--max-num-seqs", str(streams), *serve_args]
    engine = serving_model(build_parser().parse_args(serve)).build_engine()
    executor = engine.executor
    one_call = executor.cpu_layers
    if one_call is None:
        raise SystemExit("this model and these flags do not take the one-call decode path")
    rng = random.Random(0)
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)

    def decode_step_ms() -> float:
        for _ in range(streams):
            prompt = [rng.randrange(engine.vocab_size) for _ in range(PROMPT_TOKENS)]
            engine.add_request(EngineRequest(f"r{time.monotonic_ns()}", prompt, params))
        engine.step()  # the prefill, and one more for any split across steps
        engine.step()
        times = []
        while engine.has_unfinished_requests:
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    samples: dict[str, list[float]] = {"one_call": [], "python": []}

    def run() -> None:
        decode_step_ms()  # warm-up
        for round_ in range(rounds):
            sides = ("one_call", "python") if round_ % 2 == 0 else ("python", "one_call")
            for side in sides:
                executor.cpu_layers = one_call if side == "one_call" else None
                samples[side].append(decode_step_ms())
        executor.cpu_layers = one_call

    # A thread of its own, as the server's step loop: which thread calls torch matters.
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return {
        side: {"median_ms": round(statistics.median(v), 2), "rounds": [round(x, 2) for x in v]}
        for side, v in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint folder")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("serve_args", nargs="*", help="after --: flags for the engine")
    args = parser.parse_args()
    report: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "serve_args": args.serve_args,
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
    }
    for streams in args.streams:
        report[f"streams_{streams}"] = measure(args.model, streams, args.rounds, args.serve_args)
    report["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
