"""Decode attention on the CPU: the C++ kernel (`torch.ops.baton_cpu.paged_attention`) over the
bench Llama's heads (8 query heads, 4 KV heads, head_dim 64, 16-token blocks), 8 sequences of
one length, 8 layers each with its own cache, as one decode step reads them; a float32 and a
float16 cache.

    PYTHONPATH=$PWD python benchmarks/decode_attention_cpu.py --lengths 104 350

Prints, per length and cache dtype, the median and the fastest of `--iters` timed passes over
the 8 layers, in ms. To compare two trees, run it from each in turn (with a
TORCH_EXTENSIONS_DIR per tree), alternating: the machine is shared and drifts.
"""

from __future__ import annotations

import argparse

import torch
from kernel_timing import cpu_times_ms

from kernels.cpu_extension import cpu_kernels_available

SEQS, HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS = 8, 8, 4, 64, 16, 8


def time_step(length: int, dtype: torch.dtype, iters: int) -> tuple[float, float]:
    """(median, fastest) ms of one pass over the layers' attention."""
    blocks_per_seq = -(-length // BLOCK)
    num_blocks = SEQS * blocks_per_seq + 4
    caches = [
        torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM).to(dtype) for _ in range(LAYERS)
    ]
    # Each sequence's blocks shuffled over the cache, as a running server leaves them.
    order = torch.randperm(SEQS * blocks_per_seq, generator=torch.Generator().manual_seed(0))
    tables = order.to(torch.int32).view(SEQS, blocks_per_seq)
    lens = torch.full((SEQS,), length, dtype=torch.int32)
    rows = torch.arange(SEQS)
    q = torch.randn(SEQS, HEADS, HEAD_DIM)
    out = torch.empty_like(q)
    op = torch.ops.baton_cpu.paged_attention

    def step() -> None:
        for cache in caches:
            op(out, q, cache, tables, lens, rows, rows, HEAD_DIM**-0.5, 0, 0.0)

    times = cpu_times_ms(step, iters)
    return times[len(times) // 2], times[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[104, 350])
    parser.add_argument("--iters", type=int, default=80)
    args = parser.parse_args()
    if not cpu_kernels_available():
        raise SystemExit("the C++ CPU kernels did not build: nothing to time")
    for length in args.lengths:
        for dtype in (torch.float32, torch.float16):
            median, fastest = time_step(length, dtype, args.iters)
            print(
                f"{length} tokens, {dtype}: median {median:.3f} ms, fastest {fastest:.3f} ms "
                f"for {LAYERS} layers of {SEQS} sequences"
            )


if __name__ == "__main__":
    main()
