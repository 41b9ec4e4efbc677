"""Weight-only int8 linear layers (kernels/int8_linear.py) against the float32 oneDNN path they
replace (kernels/linear.py), and bfloat16 `F.linear` as this CPU runs it, on the CPU models'
shapes: the ~30M bench Llama (hidden 512) and a Qwen2.5-0.5B shape (hidden 896), at 1 to 64
rows. `int8` is what Baton runs (torch's int8 matmul up to INT8_MATMUL_MAX_ROWS rows, a float
copy of the weight beyond); `int8pack_mm` is torch's int8 matmul alone at every row count.

    python benchmarks/int8_linear.py

Microseconds per call, the median of interleaved rounds (the machine is shared: every contender
runs once per shape per round, so load drifts hit all alike); and whether int8 rows are
batch-invariant, as the float32 oneDNN path is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels.int8_linear import int8_linear, quantize_per_channel
from kernels.linear import cpu_has_native_bf16, onednn_linear, pack_linear_weight

# (model, layer, in, out): qkv, o, gate_up and down of each model, and the bench LM head.
LAYERS = [
    ("hidden 512", "qkv", 512, 1024),
    ("hidden 512", "o", 512, 512),
    ("hidden 512", "gate_up", 512, 2816),
    ("hidden 512", "down", 1408, 512),
    ("hidden 512", "lm_head", 512, 8192),
    ("hidden 896", "qkv", 896, 1152),
    ("hidden 896", "o", 896, 896),
    ("hidden 896", "gate_up", 896, 9728),
    ("hidden 896", "down", 4864, 896),
]
ROWS = (1, 4, 8, 32, 64)


def microseconds_per_call(fn: Callable[[], torch.Tensor], iters: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    cases = []
    for model, layer, k, n in LAYERS:
        weight = torch.randn(n, k, generator=generator) * 0.02
        packed = pack_linear_weight(weight, 64)
        codes, scales = quantize_per_channel(weight)
        weight_bf16 = weight.bfloat16()
        for rows in ROWS:
            x = torch.randn(rows, k, generator=generator)
            x_bf16 = x.bfloat16()
            contenders = {
                "f32_onednn": lambda x=x, p=packed: onednn_linear(x, p, None),
                "int8": lambda x=x, c=codes, s=scales: int8_linear(x, c, s, None),
                "int8pack_mm": lambda x=x, c=codes, s=scales: torch.ops.aten._weight_int8pack_mm(
                    x, c, s
                ),
                "bf16_f_linear": lambda x=x_bf16, w=weight_bf16: F.linear(x, w),
            }
            if cpu_has_native_bf16():
                packed_bf16 = pack_linear_weight(weight_bf16, 64)
                contenders["bf16_onednn"] = lambda x=x_bf16, p=packed_bf16: onednn_linear(
                    x, p, None
                )
            cases.append(((model, layer, k, n, rows), contenders, x, codes, scales))
    samples: dict[tuple, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for key, contenders, *_ in cases:
            entry = samples.setdefault(key, {name: [] for name in contenders})
            for name, fn in contenders.items():
                entry[name].append(microseconds_per_call(fn, args.iters))
    results = []
    for key, _, x, codes, scales in cases:
        model, layer, k, n, rows = key
        medians = {name: statistics.median(v) for name, v in samples[key].items()}
        pack_mm = torch.ops.aten._weight_int8pack_mm
        alone = torch.cat([pack_mm(x[i : i + 1], codes, scales) for i in range(rows)])
        results.append(
            dict(
                model=model,
                layer=f"{layer} {k}->{n}",
                rows=rows,
                **{f"{name}_us": round(us, 1) for name, us in medians.items()},
                int8_speedup=round(medians["f32_onednn"] / medians["int8"], 2),
                int8pack_mm_speedup=round(medians["f32_onednn"] / medians["int8pack_mm"], 2),
                bf16_speedup=round(medians["f32_onednn"] / medians["bf16_f_linear"], 2),
                int8pack_mm_rows_batch_invariant=torch.equal(pack_mm(x, codes, scales), alone),
            )
        )
    report = dict(
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        native_bf16=cpu_has_native_bf16(),
        results=results,
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
