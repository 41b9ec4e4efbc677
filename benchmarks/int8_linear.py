"""Weight-only int8 linear layers (kernels/int8_linear.py) against the float32 oneDNN path they
replace (kernels/linear.py), on the CPU models' shapes: the ~30M bench Llama (hidden 512) and a
Qwen2.5-0.5B shape (hidden 896), at 1 to 256 rows; and, with `--step`, one stream's decode of
the bench Llama in float32 and in int8.

    python benchmarks/int8_linear.py            # per layer shape
    python benchmarks/int8_linear.py --step     # ms per token, one stream, interleaved
    python benchmarks/int8_linear.py --cold --baseline HEAD~1   # GB/s of codes, DRAM-bound

Contenders per shape: `int8` is what Baton runs (the C++ kernel for float32), `int8_torch` the
plain-torch path it replaced and keeps where the kernel did not build (torch's int8 matmul up
to INT8_MATMUL_MAX_ROWS rows, a float copy of the weight beyond), `int8pack_mm` torch's int8
matmul alone (up to 64 rows: beyond it is many times slower than everything else), and
bfloat16 `F.linear` as this CPU runs it. Every contender runs once per shape per round
(interleaved: the machine is shared, so load drifts hit all alike); each call is timed alone,
and both the median and the fastest call (what a call costs when nothing preempts it) are
reported, in microseconds; with whether Baton's int8 rows are batch-invariant.

`--baseline REV` adds `int8_before`: the kernel source at git revision REV, built beside the
current one under another op namespace, so before and after run interleaved in one process.
`--cold` times the kernel as a decode step reads its weights: each pass runs a chain of distinct
matrices larger than the L3 (per layer shape, and a decode step's 33 matrices repeated), so the
codes stream from DRAM; it reports GB/s of codes at 1 and 2 threads, the current kernel against
the baseline's (the working tree's source built the same way, to compare like with like).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from kernel_sources import baseline_ops, build_ops

import baton.kernels.int8_linear
from baton.kernels.int8_linear import (
    int8_linear,
    int8_linear_torch,
    pack_codes,
    quantize_per_channel,
)
from baton.kernels.linear import cpu_has_native_bf16, onednn_linear, pack_linear_weight

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
ROWS = (1, 4, 8, 32, 64, 256)
INT8PACK_MM_MAX_ROWS = 64
# One stream's decode for `--step`: a 40-token prompt, 64 greedy tokens.
PROMPT = [7 + i % 50 for i in range(40)]
STEP_TOKENS = 64
KERNEL_SOURCE = Path(__file__).parents[1] / "kernels" / "csrc" / "int8_linear_cpu.cpp"
# `--cold`: the bench Llama's matrices (in, out) and how many of each one decode step reads.
STEP_MATRICES = [
    ((512, 1536), 8),
    ((512, 512), 8),
    ((512, 2816), 8),
    ((1408, 512), 8),
    ((512, 8192), 1),
]
COLD_ROWS = (1, 4, 8, 64, 256)
# Twice this VM's 32 MiB L3: a pass finds none of its codes in cache.
COLD_CHAIN_BYTES = 64 << 20


def call_seconds(fn: Callable[[], torch.Tensor], iters: int) -> list[float]:
    fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def baseline_kernel(revision: str) -> Callable:
    """The kernel as it was at git `revision`."""
    return baseline_ops(revision, "baton_int8_before").int8_linear


def cold_chains(generator: torch.Generator) -> dict[str, list]:
    """Per layer shape, and for a decode step's mix, distinct packed matrices (in, codes,
    scales) adding up to COLD_CHAIN_BYTES or more."""
    chains = {}
    step = [shape for shape, count in STEP_MATRICES for _ in range(count)]
    for name, shapes in [(f"{k}->{n}", [(k, n)]) for (k, n), _ in STEP_MATRICES] + [("step", step)]:
        chain, total = [], 0
        while total < COLD_CHAIN_BYTES:
            for k, n in shapes:
                codes = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=generator)
                chain.append((k, pack_codes(codes), torch.rand(n, generator=generator) * 1e-3))
                total += n * k
        chains[name] = chain
    return chains


def cold(kernels_by_name: dict[str, Callable], rounds: int, row_counts: list[int]) -> list[dict]:
    """GB/s of codes per pass over each chain, every kernel and thread count interleaved."""
    generator = torch.Generator().manual_seed(0)
    chains = cold_chains(generator)
    cases = [(name, rows, threads) for name in chains for rows in row_counts for threads in (1, 2)]
    widths = {k for (k, _), _ in STEP_MATRICES}
    inputs = {
        rows: {k: torch.randn(rows, k, generator=generator) for k in widths} for rows in row_counts
    }
    samples: dict[tuple, dict[str, list[float]]] = {case: {} for case in cases}
    for _ in range(rounds + 1):  # the first round warms up
        for name, rows, threads in cases:
            torch.set_num_threads(threads)
            x = inputs[rows]
            for kernel_name, kernel in kernels_by_name.items():
                start = time.perf_counter()
                for k, codes, scales in chains[name]:
                    kernel(x[k], codes, scales, None)
                samples[(name, rows, threads)].setdefault(kernel_name, []).append(
                    time.perf_counter() - start
                )
    results = []
    for name, rows, threads in cases:
        gigabytes = sum(codes.numel() for _, codes, _ in chains[name]) / 1e9
        entry = dict(matrices=name, rows=rows, threads=threads)
        for kernel_name, times in samples[(name, rows, threads)].items():
            entry[f"{kernel_name}_gbps_median"] = round(gigabytes / statistics.median(times[1:]), 2)
            entry[f"{kernel_name}_gbps_fastest"] = round(gigabytes / min(times[1:]), 2)
        results.append(entry)
    return results


def layer_cases(generator: torch.Generator, before: Callable | None, row_counts: list[int]) -> list:
    cases = []
    for model, layer, k, n in LAYERS:
        weight = torch.randn(n, k, generator=generator) * 0.02
        packed = pack_linear_weight(weight, 64)
        codes, scales = quantize_per_channel(weight)
        packed_codes = pack_codes(codes)
        weight_bf16 = weight.bfloat16()
        for rows in row_counts:
            x = torch.randn(rows, k, generator=generator)
            x_bf16 = x.bfloat16()
            contenders = {
                "f32_onednn": lambda x=x, p=packed: onednn_linear(x, p, None),
                "int8": lambda x=x, c=packed_codes, s=scales: int8_linear(x, c, s, None),
                "int8_torch": lambda x=x, c=codes, s=scales: int8_linear_torch(x, c, s, None),
                "bf16_f_linear": lambda x=x_bf16, w=weight_bf16: F.linear(x, w),
            }
            if before is not None:
                contenders["int8_before"] = lambda x=x, c=packed_codes, s=scales: before(
                    x, c, s, None
                )
            if rows <= INT8PACK_MM_MAX_ROWS:
                contenders["int8pack_mm"] = lambda x=x, c=codes, s=scales: (
                    torch.ops.aten._weight_int8pack_mm(x, c, s)
                )
            if cpu_has_native_bf16():
                packed_bf16 = pack_linear_weight(weight_bf16, 64)
                contenders["bf16_onednn"] = lambda x=x_bf16, p=packed_bf16: onednn_linear(
                    x, p, None
                )
            cases.append(((model, layer, k, n, rows), contenders, x, packed_codes, scales))
    return cases


def layers(rounds: int, iters: int, before: Callable | None, row_counts: list[int]) -> list[dict]:
    cases = layer_cases(torch.Generator().manual_seed(0), before, row_counts)
    samples: dict[tuple, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for key, contenders, *_ in cases:
            entry = samples.setdefault(key, {name: [] for name in contenders})
            for name, fn in contenders.items():
                entry[name].extend(call_seconds(fn, iters))
    results = []
    for key, _, x, codes, scales in cases:
        model, layer, k, n, rows = key
        median = {name: statistics.median(v) * 1e6 for name, v in samples[key].items()}
        fastest = {name: min(v) * 1e6 for name, v in samples[key].items()}
        alone = torch.cat([int8_linear(x[i : i + 1], codes, scales, None) for i in range(rows)])
        results.append(
            dict(
                model=model,
                layer=f"{layer} {k}->{n}",
                rows=rows,
                median_us={name: round(us, 1) for name, us in median.items()},
                fastest_us={name: round(us, 1) for name, us in fastest.items()},
                int8_over_f32_median=round(median["int8"] / median["f32_onednn"], 2),
                int8_over_f32_fastest=round(fastest["int8"] / fastest["f32_onednn"], 2),
                int8_rows_batch_invariant=torch.equal(int8_linear(x, codes, scales, None), alone),
            )
        )
    return results


def step_ms(rounds: int, before: Callable | None) -> dict:
    """One stream's decode of the bench Llama: float32, int8 through the C++ kernel (and, given
    `before`, through that kernel instead) and int8 through the plain-torch path, interleaved
    round by round in one process."""
    from baton.app.llm import LLM
    from baton.core.sampling_params import SamplingParams
    from baton.tools.random_checkpoint import write_checkpoint

    model = write_checkpoint(Path(tempfile.mkdtemp()) / "bench", "llama", "bench")
    settings = dict(max_num_seqs=64, max_num_batched_tokens=2048)
    engines = {"f32": LLM(model, **settings), "int8": LLM(model, quantization="int8", **settings)}
    params = SamplingParams(max_tokens=STEP_TOKENS, temperature=0.0, ignore_eos=True)
    kernel_takes = baton.kernels.int8_linear.uses_int8_kernel
    contenders = {"f32": True, "int8": True, "int8_torch": False}
    if before is not None:
        contenders["int8_before"] = True
    # The op as Baton's int8 layers look it up at each call, swapped for `int8_before`'s rounds.
    current = torch.ops.baton_cpu.int8_linear
    times: dict[str, list[float]] = {name: [] for name in contenders}
    # CPU seconds of the process: what preemption by other processes does not inflate (at one
    # thread; at two, a thread waiting for its descheduled partner spins and is counted).
    cpu_times: dict[str, list[float]] = {name: [] for name in contenders}
    tokens: dict[str, list[int]] = {}
    for _ in range(rounds + 1):  # the first round warms up
        for name, kernel in contenders.items():
            if not kernel:
                baton.kernels.int8_linear.uses_int8_kernel = lambda *args: False
            if name == "int8_before":
                torch.ops.baton_cpu.int8_linear = before
            llm = engines[name.removesuffix("_torch").removesuffix("_before")]
            start, cpu_start = time.perf_counter(), time.process_time()
            tokens[name] = llm.generate([PROMPT], params)[0].token_ids
            times[name].append((time.perf_counter() - start) / STEP_TOKENS * 1e3)
            cpu_times[name].append((time.process_time() - cpu_start) / STEP_TOKENS * 1e3)
            baton.kernels.int8_linear.uses_int8_kernel = kernel_takes
            torch.ops.baton_cpu.int8_linear = current
    return dict(
        ms_per_token_median={name: round(statistics.median(v[1:]), 2) for name, v in times.items()},
        ms_per_token_fastest={name: round(min(v[1:]), 2) for name, v in times.items()},
        cpu_ms_per_token_median={
            name: round(statistics.median(v[1:]), 2) for name, v in cpu_times.items()
        },
        int8_tokens_before_divergence_from_f32=tokens_in_common(tokens["int8"], tokens["f32"]),
        int8_tokens_equal_int8_torch=tokens["int8"] == tokens["int8_torch"],
        int8_tokens_equal_int8_before=tokens["int8"] == tokens.get("int8_before"),
    )


def tokens_in_common(a: list[int], b: list[int]) -> int:
    """How many tokens `a` and `b` share before their first difference."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--step", action="store_true", help="time one stream's decode instead")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--cold", action="store_true", help="GB/s over weights from DRAM instead")
    parser.add_argument("--baseline", metavar="REV", help="also the kernel at git revision REV")
    parser.add_argument("--rows", type=int, nargs="+", help="row counts (default: all listed)")
    args = parser.parse_args()
    before = baseline_kernel(args.baseline) if args.baseline else None
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    report = dict(
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        native_bf16=cpu_has_native_bf16(),
    )
    if args.step:
        report["step"] = step_ms(args.rounds, before)
    elif args.cold:
        if before is None:
            parser.error("--cold compares against a --baseline REV")
        files = {path.name: path.read_text() for path in KERNEL_SOURCE.parent.iterdir()}
        after = build_ops(files, [KERNEL_SOURCE.name], "baton_int8_after").int8_linear
        report["cold"] = cold(
            {"before": before, "after": after}, args.rounds, args.rows or COLD_ROWS
        )
    else:
        report["results"] = layers(args.rounds, args.iters, before, args.rows or ROWS)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
