"""The scheduler's own cost per step (schedule + update), with the model replaced by the
simulated executor, for a given number of running requests, and optionally a queue that the KV
pool holds back.

    python benchmarks/scheduler_overhead.py --running 256 [--waiting 64]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

from baton.core.config import EngineConfig
from baton.core.engine import Engine
from baton.core.request import EngineRequest
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.kv_growth import MIN_OBSERVATIONS
from baton.core.simulation.simulated_executor import SimulatedClock, SimulatedExecutor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument(
        "--waiting",
        type=int,
        default=0,
        help="requests queued behind the running ones, with room in the batch but not in the "
        "KV pool: every step's admission runs the slo policy's growth forecast and holds them",
    )
    args = parser.parse_args()

    block_size = 16
    clock = SimulatedClock()
    # Exactly the running requests at their full length: the queue never fits beside them.
    tokens_per_request = args.prompt_len + args.steps + 4
    num_blocks = args.running * (-(-tokens_per_request // block_size))
    executor = SimulatedExecutor(num_blocks, block_size, 32000, clock)
    config = EngineConfig(
        max_num_seqs=args.running + args.waiting,
        max_num_batched_tokens=args.running * args.prompt_len,
        block_size=block_size,
        # The queue stays held for the whole run, not let in by the starvation bound.
        max_wait_ms=3_600_000,
    )
    engine = Engine(
        config, executor, max_model_len=8192, vocab_size=32000, eos_token_ids=[], clock=clock
    )
    rng = random.Random(0)

    def add(request_id: str, max_tokens: int) -> None:
        prompt = [rng.randrange(32000) for _ in range(args.prompt_len)]
        request = EngineRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens))
        engine.add_request(engine.validator.validate(request))

    if args.waiting:
        # The length predictor forecasts only once it has seen enough answers end; these run
        # to their max_tokens, so it predicts every answer does.
        for i in range(MIN_OBSERVATIONS):
            add(f"warm{i}", 2)
        while engine.has_unfinished_requests:
            engine.step()
    for i in range(args.running):
        add(f"r{i}", args.steps + 4)
    engine.step()  # every prompt prefills in one step; from here on all are decoding
    for i in range(args.waiting):
        add(f"w{i}", args.steps + 4)
    gc.freeze()  # as the step thread does once it starts

    scheduler = engine.scheduler
    schedule_us, update_us, step_us = [], [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        batch = scheduler.schedule(clock())
        t1 = time.perf_counter()
        result = executor.execute(batch)
        t2 = time.perf_counter()
        scheduler.update(batch, result)
        t3 = time.perf_counter()
        assert len(batch) == args.running
        schedule_us.append((t1 - t0) * 1e6)
        update_us.append((t3 - t2) * 1e6)
        step_us.append((t1 - t0 + t3 - t2) * 1e6)

    def summary(samples: list[float]) -> dict[str, float]:
        samples = sorted(samples)
        return {
            "mean_us": round(statistics.fmean(samples), 1),
            "p50_us": round(samples[len(samples) // 2], 1),
            "p99_us": round(samples[int(len(samples) * 0.99)], 1),
        }

    print(
        json.dumps(
            {
                "running_requests": args.running,
                "waiting_requests": args.waiting,
                "steps": args.steps,
                "schedule": summary(schedule_us),
                "update": summary(update_us),
                "schedule_plus_update": summary(step_us),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
