"""How fast Baton's CPU linear kernels multiply at each row count, cache-warm: the float32
kernel (`torch.ops.baton_cpu.f32_linear`) and the int8 one (`torch.ops.baton_cpu.int8_linear`)
on two bench-Llama shapes, one thread by default, so the figure is the tile's own pace, with
neither DRAM nor the thread split in it.

    PYTHONPATH=$PWD python benchmarks/linear_tiles_cpu.py --rows 4 6 8 32

Prints G multiply-adds a second per kernel, shape and row count: from the 10th-percentile call
of `--iters`, the pace when nothing preempts it. To compare two trees, run it from each in turn
(with a TORCH_EXTENSIONS_DIR per tree), alternating.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial

import torch
from kernel_timing import cpu_times_ms

from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.f32_linear import pack_weight
from baton.kernels.int8_linear import pack_codes, quantize_per_channel

SHAPES = [(512, 2816), (1408, 512)]  # (in, out): gate_up and down


def pace(call: Callable[[], torch.Tensor], macs: int, iters: int) -> float:
    """G multiply-adds a second at the 10th-percentile call."""
    times = cpu_times_ms(call, iters, warmup=20)
    return macs / times[len(times) // 10] / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 6, 8, 32])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    if not cpu_kernels_available():
        raise SystemExit("the C++ CPU kernels did not build: nothing to time")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for in_features, out_features in SHAPES:
        weight = torch.randn(out_features, in_features)
        packed = pack_weight(weight)
        codes, scales = quantize_per_channel(weight)
        packed_codes = pack_codes(codes)
        for rows in args.rows:
            x = torch.randn(rows, in_features)
            macs = rows * in_features * out_features
            f32_call = partial(torch.ops.baton_cpu.f32_linear, x, packed, None, out_features)
            int8_call = partial(torch.ops.baton_cpu.int8_linear, x, packed_codes, scales, None)
            f32 = pace(f32_call, macs, args.iters)
            int8 = pace(int8_call, macs, args.iters)
            print(
                f"{in_features}->{out_features}, {rows} rows: float32 {f32:.1f}, "
                f"int8 {int8:.1f} G multiply-adds/s"
            )


if __name__ == "__main__":
    main()
