"""The CPU path's own kernels against what they replace, on the offline benchmark's shapes.

    python benchmarks/cpu_kernels.py

Linear layers: `F.linear` (MKL's sgemm) against oneDNN over a packed weight (kernels/linear.py)
at a decode step's rows and a prefill chunk's, for the ~30M Llama of offline_throughput.py
(hidden 512, intermediate 1408, vocab 8192), GFLOP/s as the median of interleaved rounds; and
whether a row's bits depend on how many rows share the call.
Decode attention: 64 decodes of 64-400 cached tokens (8 heads, 4 KV heads, head_dim 64,
16-token blocks scattered over a 4,096-block cache), the C++ kernel against the plain-torch
padded SDPA path (kernels/paged_attention.py), ms per layer, interleaved rounds.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.linear import onednn_linear, pack_linear_weight
from baton.kernels.paged_attention import paged_attention_cpu, plain_torch_decodes

# (rows, in, out): qkv, gate_up, down and the LM head at 64 decodes; gate_up at a 2,048-token
# prefill chunk.
LINEAR_SHAPES = [
    (64, 512, 1024),
    (64, 512, 2816),
    (64, 1408, 512),
    (64, 512, 8192),
    (2048, 512, 2816),
]


def seconds_per_call(fn, iters: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def linear_rows(rounds: int) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    cases = []
    for rows, k, n in LINEAR_SHAPES:
        x = torch.randn(rows, k, generator=generator)
        weight = torch.randn(n, k, generator=generator)
        cases.append((rows, k, n, x, weight, pack_linear_weight(weight, 64)))
    samples: dict[tuple, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for rows, k, n, x, weight, packed in cases:
            gflop = 2 * rows * k * n / 1e9
            iters = 5 if rows > 64 else 30
            entry = samples.setdefault((rows, k, n), {"F.linear": [], "oneDNN packed": []})
            mkl = partial(F.linear, x, weight)
            onednn = partial(onednn_linear, x, packed, None)
            entry["F.linear"].append(gflop / seconds_per_call(mkl, iters))
            entry["oneDNN packed"].append(gflop / seconds_per_call(onednn, iters))
    results = []
    for rows, k, n, x, weight, packed in cases:
        alone = torch.cat([onednn_linear(x[i : i + 1], packed, None) for i in range(8)])
        mkl_alone = torch.cat([F.linear(x[i : i + 1], weight) for i in range(8)])
        medians = {name: statistics.median(v) for name, v in samples[(rows, k, n)].items()}
        results.append(
            dict(
                shape=f"{rows}x{k} @ {k}x{n}",
                mkl_gflops=round(medians["F.linear"], 1),
                onednn_gflops=round(medians["oneDNN packed"], 1),
                speedup=round(medians["oneDNN packed"] / medians["F.linear"], 2),
                onednn_rows_batch_invariant=torch.equal(onednn_linear(x, packed, None)[:8], alone),
                mkl_rows_batch_invariant=torch.equal(F.linear(x, weight)[:8], mkl_alone),
            )
        )
    return results


def decode_batch(seed: int = 0):
    block_size, num_heads, num_kv_heads, head_dim, num_blocks = 16, 8, 4, 64, 4096
    rng = random.Random(seed)
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim)
    seq_lens = [rng.randint(64, 400) for _ in range(64)]
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in seq_lens]
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    q = torch.randn(len(seq_lens), num_heads, head_dim)
    return q, kv_cache, block_tables, list(range(len(seq_lens) + 1)), seq_lens, head_dim**-0.5


def attention_rows(rounds: int) -> dict:
    batch = decode_batch()
    ms: dict[str, list[float]] = {"kernel": [], "plain torch": []}
    for _ in range(rounds):
        ms["kernel"].append(seconds_per_call(lambda: paged_attention_cpu(*batch), 20) * 1e3)
        with plain_torch_decodes():
            ms["plain torch"].append(
                seconds_per_call(lambda: paged_attention_cpu(*batch), 20) * 1e3
            )
    kv_mb = sum(batch[4]) * 2 * 4 * 64 * 4 / 1e6
    return dict(
        kv_mb_read=round(kv_mb, 1),
        **{f"{name}_ms_median": round(statistics.median(v), 2) for name, v in ms.items()},
        **{f"{name}_ms_min": round(min(v), 2) for name, v in ms.items()},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    assert cpu_kernels_available(), "the C++ kernel did not build (see the log)"
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    for row in linear_rows(args.rounds):
        print(row)
    print({"decode attention, 64 sequences": attention_rows(args.rounds)})


if __name__ == "__main__":
    main()
