"""A decode step's linear layers on the CPU, as the step meets them: every linear of a model's
decoder layers (qkv, o, gate_up, down) in turn, both of Baton's kernels (float32,
`torch.ops.baton_cpu.f32_linear`, and int8, `torch.ops.baton_cpu.int8_linear`), at each row
count. The weights are far larger than L3, so each pass streams them from DRAM, as a decode
step does; `benchmarks/linear_tiles_cpu.py` times the tiles cache-warm instead.

    PYTHONPATH=$PWD python benchmarks/linear_decode_cpu.py --model bench --rows 1 4 8 16 32

Prints, per row count, the 25th-percentile ms of one pass over all the layers per kernel. To
compare two trees, run it from each in turn (with a TORCH_EXTENSIONS_DIR per tree),
alternating: the machine is shared and drifts.
"""

from __future__ import annotations

import argparse

import torch
from kernel_timing import cpu_times_ms

from kernels.cpu_extension import cpu_kernels_available
from kernels.f32_linear import pack_weight
from kernels.int8_linear import pack_codes, quantize_per_channel

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


def pass_ms(run, iters: int) -> float:
    """The 25th-percentile ms of `iters` timed passes after 3 untimed ones."""
    times = cpu_times_ms(run, iters)
    return times[len(times) // 4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="bench")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=15)
    args = parser.parse_args()
    if not cpu_kernels_available():
        raise SystemExit("the C++ CPU kernels did not build: nothing to time")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    f32, int8 = [], []
    for in_features, out_features in layer_shapes(args.model):
        weight = torch.randn(out_features, in_features)
        f32.append((pack_weight(weight), out_features))
        codes, scales = quantize_per_channel(weight)
        int8.append((pack_codes(codes), scales))
        del weight, codes
    for rows in args.rows:
        xs = {k: torch.randn(rows, k) for k, _ in set(layer_shapes(args.model))}
        inputs = [xs[k] for k, _ in layer_shapes(args.model)]

        def run_f32(inputs=inputs):
            for x, (packed, out_features) in zip(inputs, f32, strict=True):
                torch.ops.baton_cpu.f32_linear(x, packed, None, out_features)

        def run_int8(inputs=inputs):
            for x, (codes, scales) in zip(inputs, int8, strict=True):
                torch.ops.baton_cpu.int8_linear(x, codes, scales, None)

        print(
            f"{args.model}, {rows} rows: float32 {pass_ms(run_f32, args.iters):.2f} ms, "
            f"int8 {pass_ms(run_int8, args.iters):.2f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
