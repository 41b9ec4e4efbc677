"""Attention on the CPU: the C++ kernel (`torch.ops.baton_cpu.paged_attention`) over the bench
Llama's heads (8 query heads, 4 KV heads, head_dim 64, 16-token blocks), 8 layers each with its
own cache, a float32 and a float16 cache; a decode step's (8 sequences of one length, one row
each) and a prefill chunk's (one sequence's last rows, each with its causal length).

    PYTHONPATH=$PWD python benchmarks/decode_attention_cpu.py --lengths 104 350 \
        --prefill 40/40 512/600

Prints, per case and cache dtype, the median and the fastest of `--iters` timed passes over
the 8 layers, in ms, and the pace: the cache's bytes read a second for a decode, the
multiply-adds' flops for a prefill. Before each pass a 64 MiB buffer is written, as a decode
step's weight read evicts the cache from L3 between one layer's attention and the next step's
(`--warm` leaves the cache where the last pass left it). To compare two trees, run it from each
in turn (with a TORCH_EXTENSIONS_DIR per tree), alternating: the machine is shared and drifts.
"""

from __future__ import annotations

import argparse

import torch
from kernel_timing import cpu_times_ms

from baton.kernels.cpu_extension import cpu_kernels_available

SEQS, HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS = 8, 8, 4, 64, 16, 8
EVICT_BYTES = 64 * 2**20


def time_passes(
    lens: list[int], seqs: list[int], dtype: torch.dtype, iters: int, warm: bool
) -> tuple[float, float]:
    """(median, fastest) ms of one pass over the layers' attention for rows of sequences `seqs`
    (numbered from 0) with causal lengths `lens`, each sequence's blocks shuffled over the
    cache as a running server leaves them."""
    num_seqs = max(seqs) + 1
    blocks_per_seq = -(-max(lens) // BLOCK)
    num_blocks = num_seqs * blocks_per_seq + 4
    caches = [
        torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM).to(dtype) for _ in range(LAYERS)
    ]
    order = torch.randperm(num_seqs * blocks_per_seq, generator=torch.Generator().manual_seed(0))
    tables = order.to(torch.int32).view(num_seqs, blocks_per_seq)
    rows = torch.arange(len(lens))
    seq_ids = torch.tensor(seqs)
    row_lens = torch.tensor(lens)
    q = torch.randn(len(lens), HEADS, HEAD_DIM)
    out = torch.empty_like(q)
    evict = torch.zeros(EVICT_BYTES, dtype=torch.uint8)
    op = torch.ops.baton_cpu.paged_attention

    def attend() -> None:
        for cache in caches:
            op(out, q, cache, tables, row_lens, rows, seq_ids, HEAD_DIM**-0.5, 0, 0.0)

    times = cpu_times_ms(attend, iters, before=None if warm else lambda: evict.add_(1))
    return times[len(times) // 2], times[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths", type=int, nargs="*", default=[104, 350], help="decode: tokens a sequence"
    )
    parser.add_argument(
        "--prefill",
        nargs="*",
        default=[],
        metavar="CHUNK/TOTAL",
        help="prefill: the last CHUNK rows of a TOTAL-token prompt",
    )
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warm", action="store_true", help="no eviction between passes")
    args = parser.parse_args()
    if not cpu_kernels_available():
        raise SystemExit("the C++ CPU kernels did not build: nothing to time")
    cases = [(f"decode {SEQS} x {n} tokens", [n] * SEQS, list(range(SEQS))) for n in args.lengths]
    for spec in args.prefill:
        chunk, total = (int(part) for part in spec.split("/"))
        if not 0 < chunk <= total:
            parser.error(f"--prefill {spec}: CHUNK must be 1..TOTAL")
        cases.append(
            (
                f"prefill {chunk} of {total} tokens",
                list(range(total - chunk + 1, total + 1)),
                [0] * chunk,
            )
        )
    for name, lens, seqs in cases:
        for dtype in (torch.float32, torch.float16):
            median, fastest = time_passes(lens, seqs, dtype, args.iters, args.warm)
            keys = sum(lens)  # (row, key) pairs
            if len(set(seqs)) == len(seqs):
                cache_bytes = keys * KV_HEADS * HEAD_DIM * 2 * dtype.itemsize * LAYERS
                pace = f"{cache_bytes / median / 1e6:.1f} GB/s of cache"
            else:
                flops = keys * HEADS * HEAD_DIM * 4 * LAYERS
                pace = f"{flops / median / 1e6:.0f} GF/s"
            print(
                f"{name}, {dtype}: median {median:.3f} ms, fastest {fastest:.3f} ms for {LAYERS} "
                f"layers ({pace} at the median)",
                flush=True,
            )


if __name__ == "__main__":
    main()
