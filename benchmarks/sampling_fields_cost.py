"""What `logit_bias` and prompt log-probabilities cost a step, and that free requests pay nothing.

    python benchmarks/sampling_fields_cost.py                # CPU, vocab 32000, batch 64
    PYTHONPATH=/path/to/other/checkout python benchmarks/sampling_fields_cost.py --free-only
    python benchmarks/sampling_fields_cost.py --free-only --engine CHECKPOINT

Times the sampler over a batch of decoding requests at temperature 1: all free, then with a
quarter of them carrying a 50-token `logit_bias`. `--free-only` runs just the free case, with
only the fields every Baton version has, so two checkouts can be compared A/B. Then the LM head
and log-softmax over a 512-token prompt chunk (what scoring a prompt adds to its prefill step)
against the last-position logits every prefill computes anyway. `--engine CHECKPOINT` times
whole engine steps instead (mean over a run of 32 sampled requests, from the executor's
counters), free, then (without `--free-only`) with 8 of them biased and one scoring its prompt.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from kernel_timing import cpu_times_ms

from baton.core.batch import ScheduledSequence
from baton.core.sampling_params import SamplingParams
from baton.gpu.sampler import Sampler


def median_ms(run: Callable[[], object], iters: int) -> float:
    return statistics.median(cpu_times_ms(run, iters, warmup=1))


def sequences(batch: int, biased: int) -> list[ScheduledSequence]:
    seqs = []
    for i in range(batch):
        params = SamplingParams(temperature=1.0, max_tokens=64)
        if i < biased:
            params = SamplingParams(
                temperature=1.0, max_tokens=64, logit_bias={t: 5.0 for t in range(i, i + 50)}
            )
        history = [1] * 128
        seqs.append(ScheduledSequence(f"r{i}", [1], 128, [0], True, params, history, 120))
    return seqs


def engine_step_ms(checkpoint: str, biased: int, scored: int) -> float:
    """Mean step time of 32 requests (64-token prompts, 32 sampled tokens each)."""
    from baton.app.llm import LLM

    llm = LLM(checkpoint, device="cpu", num_kv_blocks=512, max_num_seqs=32)
    params = []
    for i in range(32):
        extra = {"logit_bias": {t: 5.0 for t in range(i, i + 50)}} if i < biased else {}
        if i >= 32 - scored:
            extra["prompt_logprobs"] = 1
        params.append(
            SamplingParams(temperature=1.0, max_tokens=32, seed=i, ignore_eos=True, **extra)
        )
    prompts = [[(7 * i + j) % 400 + 3 for j in range(64)] for i in range(32)]
    llm.generate(prompts[:2], params[:2])  # warm-up
    executor = llm.engine.executor
    steps, seconds = executor.num_steps, executor.step_time_s
    llm.generate(prompts, params)
    return (executor.step_time_s - seconds) / (executor.num_steps - steps) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--free-only", action="store_true")
    parser.add_argument("--engine", metavar="CHECKPOINT", help="time whole engine steps")
    args = parser.parse_args()
    if args.engine:
        print(f"engine step, 32 free requests: {engine_step_ms(args.engine, 0, 0):.2f} ms")
        if not args.free_only:
            ms = engine_step_ms(args.engine, 8, 1)
            print(f"engine step, 8 of 32 biased, 1 scoring its prompt: {ms:.2f} ms")
        return
    torch.manual_seed(0)
    logits = torch.randn(args.batch, args.vocab)
    sampler = Sampler(args.vocab, [2])
    free = sequences(args.batch, 0)
    ms = median_ms(lambda: sampler(logits, free), args.iters)
    print(f"sampler, {args.batch} free rows: {ms:.3f} ms")
    if args.free_only:
        return
    biased = sequences(args.batch, args.batch // 4)
    ms = median_ms(lambda: sampler(logits, biased), args.iters)
    print(f"sampler, {args.batch // 4} of {args.batch} rows with 50-token logit_bias: {ms:.3f} ms")

    from baton.core.batch import Batch
    from baton.gpu.prompt_logprobs import prompt_logprobs

    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    chunk = 512
    hidden = torch.randn(chunk, args.hidden)
    tokens = torch.randint(3, args.vocab, (chunk + 1,)).tolist()
    params = SamplingParams(max_tokens=0, prompt_logprobs=1)
    seq = ScheduledSequence(
        "s", tokens[:chunk], 0, [0], False, params, tokens, chunk + 1, range(chunk)
    )
    batch = Batch([seq])
    with torch.inference_mode():
        last = median_ms(lambda: head(hidden[-1:]).float(), args.iters // 5)
        scored = median_ms(
            lambda: prompt_logprobs(batch, hidden, [0, chunk], head, args.vocab), args.iters // 5
        )
    print(f"LM head, last position of a {chunk}-token chunk: {last:.3f} ms")
    print(f"prompt logprobs over all {chunk} positions (top-1): {scored:.3f} ms")


if __name__ == "__main__":
    main()
