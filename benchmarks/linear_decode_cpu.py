"""A decode step's linear layers on the CPU, as the step meets them: every linear of a model's
decoder layers (qkv, o, gate_up, down) in turn, both of Baton's kernels (float32,
`torch.ops.baton_cpu.f32_linear`, and int8, `torch.ops.baton_cpu.int8_linear`), at each row
count. The weights are far larger than L3, so each pass streams them from DRAM, as a decode
step does, and they sit on transparent huge pages as the server puts them (`--small-pages`
leaves them on 4 KiB pages, where a stream runs slower and other things bound it);
`benchmarks/linear_tiles_cpu.py` times the tiles cache-warm instead.

    PYTHONPATH=$PWD python benchmarks/linear_decode_cpu.py --model bench --rows 1 4 8 16 32
    PYTHONPATH=$PWD python benchmarks/linear_decode_cpu.py --model 0.4b --baseline HEAD~1

Prints, per row count, the 25th-percentile ms of one pass over all the layers per kernel.
`--baseline REV` also builds the kernels as they were at git revision REV
(`benchmarks/kernel_sources.py`) and times them interleaved with the current ones, pass by pass,
then checks that both give the same bits.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from kernel_sources import baseline_ops

from baton.gpu.huge_pages import move_to_huge_pages
from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.f32_linear import pack_weight
from baton.kernels.int8_linear import pack_codes, quantize_per_channel

# (hidden, intermediate, qkv width, layers): the bench Llama and the 0.4B one.
MODELS = {"bench": (512, 1408, 1024, 8), "0.4b": (896, 4864, 1152, 24)}


def layer_shapes(model: str) -> list[tuple[int, int]]:
    """(in, out) of every linear of the decoder layers, in a step's order."""
    hidden, intermediate, qkv, layers = MODELS[model]
    per_layer = [
        (hidden, qkv),
        (hidden, hidden),
        (hidden, 2 * intermediate),
        (intermediate, hidden),
    ]
    return per_layer * layers


def interleaved_ms(runs: dict[str, Callable[[], object]], iters: int) -> dict[str, float]:
    """Per run, the 25th-percentile ms of `iters` timed passes, the runs taking turns pass by
    pass after 3 untimed passes each."""
    for run in runs.values():
        for _ in range(3):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(iters):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: sorted(samples)[len(samples) // 4] for name, samples in times.items()}


def same_bits(kernels: dict[str, Any]) -> bool:
    """Whether every kernel namespace gives the same outputs for both dtypes, with a bias, at a
    decode step's row counts and a prefill's, on shapes with and without whole 16-channel
    groups."""
    generator = torch.Generator().manual_seed(1)
    for rows in (1, 3, 8, 13, 33, 64):
        for k, n in ((512, 1024), (1408, 512), (96, 40)):
            weight = torch.randn(n, k, generator=generator) * k**-0.5
            x, bias = torch.randn(rows, k, generator=generator), torch.randn(n, generator=generator)
            packed = pack_weight(weight)
            codes, scales = quantize_per_channel(weight)
            codes = pack_codes(codes)
            outs = [
                (ops.f32_linear(x, packed, bias, n), ops.int8_linear(x, codes, scales, bias))
                for ops in kernels.values()
            ]
            for f32, int8 in outs[1:]:
                if not (torch.equal(f32, outs[0][0]) and torch.equal(int8, outs[0][1])):
                    return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="bench")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--baseline", metavar="REV", help="also the kernels at git revision REV")
    parser.add_argument("--small-pages", action="store_true", help="weights on 4 KiB pages")
    args = parser.parse_args()
    if not cpu_kernels_available():
        raise SystemExit("the C++ CPU kernels did not build: nothing to time")
    kernels = {"": torch.ops.baton_cpu}
    if args.baseline:
        kernels["before "] = baseline_ops(args.baseline, "baton_cpu_before")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    f32, int8 = [], []
    for in_features, out_features in layer_shapes(args.model):
        weight = torch.randn(out_features, in_features)
        f32.append((pack_weight(weight), out_features))
        codes, scales = quantize_per_channel(weight)
        int8.append((pack_codes(codes), scales))
        del weight, codes
    if not args.small_pages:
        weights = [packed for packed, _ in f32] + [t for pair in int8 for t in pair]
        moved = move_to_huge_pages(weights)
        print(f"weights on huge pages: {moved / 2**20:.0f} MiB", flush=True)
    for rows in args.rows:
        xs = {k: torch.randn(rows, k) for k, _ in set(layer_shapes(args.model))}
        inputs = [xs[k] for k, _ in layer_shapes(args.model)]
        runs = {}
        for prefix, ops in kernels.items():

            def run_f32(inputs=inputs, ops=ops):
                for x, (packed, out_features) in zip(inputs, f32, strict=True):
                    ops.f32_linear(x, packed, None, out_features)

            def run_int8(inputs=inputs, ops=ops):
                for x, (codes, scales) in zip(inputs, int8, strict=True):
                    ops.int8_linear(x, codes, scales, None)

            runs[f"{prefix}float32"], runs[f"{prefix}int8"] = run_f32, run_int8
        times = interleaved_ms(runs, args.iters)
        line = ", ".join(f"{name} {ms:.2f} ms" for name, ms in times.items())
        print(f"{args.model}, {rows} rows: {line}", flush=True)
    if args.baseline:
        print("same bits as the baseline:", same_bits(kernels))


if __name__ == "__main__":
    main()
