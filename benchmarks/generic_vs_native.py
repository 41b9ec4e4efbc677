"""The generic path's offline throughput as a fraction of the native path's, on one random Llama
checkpoint that both can run (`--model-impl transformers` against `native`).

    python benchmarks/generic_vs_native.py                # ~30M-param random Llama, CPU
    python benchmarks/generic_vs_native.py --rounds 5 --num-requests 64

Both paths get the same workload (offline_throughput.py's: N requests, prompt and output lengths
uniform in the given ranges, greedy, ignore_eos) on engines built fresh per run, and the runs
alternate native, generic, native, ... so that a noisy machine weighs on both alike. Throughput
counts generated tokens per second; the fraction is the ratio of the two medians.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
from pathlib import Path

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams
from baton.tools.random_checkpoint import write_checkpoint

IMPLS = ("native", "transformers")
# Not the workload's prompts: a warm-up on those would leave them in the prefix cache.
WARM_UP_PROMPTS = [[3] * 24, [4] * 40]


def make_workload(
    n: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab: int, seed: int
) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(*input_len))] for _ in range(n)]
    outputs = [rng.randint(*output_len) for _ in range(n)]
    return prompts, outputs


def run(model: Path, impl: str, prompts, outputs, args) -> tuple[float, list[list[int]]]:
    """Generated tokens per second of one fresh engine on `impl`, and the tokens themselves."""
    llm = LLM(
        model,
        device="cpu",
        model_impl=impl,
        max_num_seqs=args.num_requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    llm.generate(WARM_UP_PROMPTS, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outputs]
    start = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    tokens = [r.token_ids for r in results]
    assert [len(t) for t in tokens] == outputs, "each request gets its max_tokens"
    del llm, results
    gc.collect()
    return sum(outputs) / elapsed, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench", help="baton.tools.random_checkpoint's shape")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--input-len", type=int, nargs=2, default=(32, 256))
    parser.add_argument("--output-len", type=int, nargs=2, default=(32, 128))
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3, help="runs per path, interleaved")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model = write_checkpoint(tempfile.mkdtemp(prefix="baton-generic-bench-"), "llama", args.preset)
    vocab = 8192 if args.preset == "bench" else 512
    prompts, outputs = make_workload(
        args.num_requests, tuple(args.input_len), tuple(args.output_len), vocab, args.seed
    )
    throughput: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    tokens: dict[str, list[list[int]]] = {}
    for round_index in range(args.rounds):
        for impl in IMPLS:
            tokens_per_s, tokens[impl] = run(model, impl, prompts, outputs, args)
            throughput[impl].append(tokens_per_s)
            print(f"round {round_index + 1} {impl:>12}: {tokens_per_s:8.1f} generated tokens/s")
    same = sum(a == b for a, b in zip(tokens["native"], tokens["transformers"], strict=True))
    medians = {impl: statistics.median(values) for impl, values in throughput.items()}
    print(f"same greedy tokens on both paths: {same}/{len(prompts)} requests")
    for impl in IMPLS:
        print(f"median {impl:>12}: {medians[impl]:8.1f} generated tokens/s")
    print(f"generic / native: {medians['transformers'] / medians['native']:.2f}x")


if __name__ == "__main__":
    main()
