"""Baton's float32 linear kernel (kernels/f32_linear.py) against the oneDNN path it would replace
(kernels/linear.py), cache-cold, on the CPU models' shapes: the ~30M bench Llama (hidden 512)
and the 0.4B bench shape (hidden 896), at decode (1-8 rows) and prefill (64-256 rows) sizes.

    python benchmarks/f32_linear.py                          # 1 and 2 threads, all rows
    python benchmarks/f32_linear.py --threads 2 --rows 1 4   # a subset

Each case is a chain of distinct weights larger than the L3 cache (as a decode step reads its
layers), timed whole: the bench Llama's 33 weights (8 layers of qkv, o, gate_up, down and the
LM head, 111 MB) in ms per chain, and each layer shape as copies of one shape in µs per call.
The contenders run in turn within each round (interleaved: the machine is shared, so load
drifts hit both alike); the median and the fastest of the rounds are reported, with whether
the kernel's rows came out bitwise the same alone and batched.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.f32_linear import f32_linear, pack_weight
from baton.kernels.linear import onednn_linear, pack_linear_weight

# (case, in, out): each model's qkv, o, gate_up and down, and the bench LM head.
LAYERS = [
    ("hidden 512 qkv", 512, 1024),
    ("hidden 512 o", 512, 512),
    ("hidden 512 gate_up", 512, 2816),
    ("hidden 512 down", 1408, 512),
    ("hidden 512 lm_head", 512, 8192),
    ("hidden 896 qkv", 896, 1152),
    ("hidden 896 o", 896, 896),
    ("hidden 896 gate_up", 896, 9728),
    ("hidden 896 down", 4864, 896),
]
BENCH_LLAMA = [(k, n) for _ in range(8) for _, k, n in LAYERS[:4]] + [(512, 8192)]
# Bytes of weights per chain: more than the VM's 32 MB L3, so every call reads from memory.
CHAIN_BYTES = 96 * 2**20
# What the CPU executor packs oneDNN's weights for (its default max_num_seqs).
ONEDNN_ROWS_HINT = 64


def chain_seconds(calls: list[Callable[[], torch.Tensor]]) -> float:
    start = time.perf_counter()
    for call in calls:
        call()
    return time.perf_counter() - start


def contenders(sizes: list[tuple[int, int]], rows: int, generator: torch.Generator) -> dict:
    weights = [torch.randn(n, k, generator=generator) * k**-0.5 for k, n in sizes]
    inputs = {k: torch.randn(rows, k, generator=generator) for k, _ in sizes}
    onednn = [pack_linear_weight(w, ONEDNN_ROWS_HINT) for w in weights]
    baton = [pack_weight(w) for w in weights]
    return {
        "onednn": [
            lambda x=inputs[k], p=p: onednn_linear(x, p, None)
            for (k, _), p in zip(sizes, onednn, strict=True)
        ],
        "baton": [
            lambda x=inputs[k], p=p, n=n: f32_linear(x, p, None, n)
            for (k, n), p in zip(sizes, baton, strict=True)
        ],
    }


def rows_invariant(k: int, n: int, rows: int, generator: torch.Generator) -> bool:
    """Whether each of `rows` rows gets the same bits alone as in the batch."""
    packed = pack_weight(torch.randn(n, k, generator=generator))
    x = torch.randn(rows, k, generator=generator)
    alone = torch.cat([f32_linear(x[i : i + 1], packed, None, n) for i in range(rows)])
    return torch.equal(f32_linear(x, packed, None, n), alone)


def run_case(sizes: list[tuple[int, int]], rows: int, rounds: int, seed: int) -> dict:
    calls = contenders(sizes, rows, torch.Generator().manual_seed(seed))
    for chain in calls.values():
        chain_seconds(chain)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, chain in calls.items():
            times[name].append(chain_seconds(chain))
    return times


def row(case: str, unit: str, scale: float, rows: int, threads: int, times, invariant) -> str:
    med = {name: statistics.median(t) * scale for name, t in times.items()}
    fast = {name: min(t) * scale for name, t in times.items()}
    return (
        f"| {case} | {threads} | {rows} | {med['onednn']:.{unit}f} / {fast['onednn']:.{unit}f} "
        f"| {med['baton']:.{unit}f} / {fast['baton']:.{unit}f} "
        f"| {med['baton'] / med['onednn']:.2f}× | {fast['baton'] / fast['onednn']:.2f}× "
        f"| {'yes' if invariant else 'NO'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 64, 256])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    if not cpu_kernels_available():
        raise SystemExit("Baton's C++ CPU kernels did not build (g++ and ninja: scripts/setup)")
    generator = torch.Generator().manual_seed(0)
    print(
        "| case | threads | rows | oneDNN median / fastest | Baton kernel median / fastest "
        "| Baton / oneDNN median | fastest | rows invariant |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for rows in args.rows:
            times = run_case(BENCH_LLAMA, rows, args.rounds, seed=rows)
            invariant = rows_invariant(512, 2816, max(rows, 2), generator)
            print(row("bench Llama, 33 weights (ms)", "2", 1e3, rows, threads, times, invariant))
        if not args.layers:
            continue
        for case, k, n in LAYERS:
            copies = max(2, -(-CHAIN_BYTES // (k * n * 4)))
            for rows in args.rows:
                times = run_case([(k, n)] * copies, rows, args.rounds, seed=rows)
                invariant = rows_invariant(k, n, max(rows, 2), generator)
                scale = 1e6 / copies
                print(row(f"{case} {k}→{n} (µs)", "0", scale, rows, threads, times, invariant))


if __name__ == "__main__":
    main()
