"""What a one-stream decode step on the CPU must cost, and what Baton's calls add to it.

    python benchmarks/cpu_decode_floor.py            # the ~30M bench Llama's shapes
    python benchmarks/cpu_decode_floor.py --ops      # also torch ops per step, layer ops off/on
    python benchmarks/cpu_decode_floor.py --step     # also ms per token, layer ops off/on

A decode step reads every linear weight once. This times the bench Llama's 33 weights
(8 layers of qkv, o, gate_up, down, and the LM head) as one cache-cold chain at M rows through
MKL (`F.linear`), oneDNN over packed weights (Baton's float32 path), bf16 weights and fbgemm's
dynamic int8, beside the memory bandwidth `torch.sum` reaches: the floor a float32 step cannot
beat. `--ops` counts the torch operators a step calls (profiler events, top level and nested)
with Baton's C++ layer ops and with the plain-torch references; counts do not depend on load.
`--step` times one stream's decode (`LLM.generate`, 64 tokens) both ways, interleaved in one
process, so the two sides share the machine's state.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from baton.kernels.linear import onednn_linear, pack_linear_weight
from baton.tools.random_checkpoint import PRESETS


def weights() -> list[torch.Tensor]:
    """The bench Llama's linear weights (baton.tools.random_checkpoint's `bench` shape), random."""
    bench = PRESETS["bench"]
    hidden, intermediate = bench["hidden_size"], bench["intermediate_size"]
    kv = hidden // bench["num_attention_heads"] * bench["num_key_value_heads"]
    per_layer = [(hidden + 2 * kv, hidden), (hidden, hidden), (2 * intermediate, hidden)]
    per_layer.append((hidden, intermediate))
    sizes = [size for _ in range(bench["num_hidden_layers"]) for size in per_layer]
    return [torch.randn(size) for size in [*sizes, (bench["vocab_size"], hidden)]]


def chain_ms(calls, rounds: int = 10) -> float:
    for _ in range(3):
        calls()
    start = time.perf_counter()
    for _ in range(rounds):
        calls()
    return (time.perf_counter() - start) / rounds * 1e3


def bandwidth_gbs() -> float:
    data = torch.randn(64 * 2**20)
    seconds = chain_ms(lambda: data.sum(), rounds=5) / 1e3
    return data.numel() * 4 / seconds / 1e9


def linear_chains(rows: int) -> dict[str, float]:
    ws = weights()
    inputs = {k: torch.randn(rows, k) for k in {w.shape[1] for w in ws}}
    packed = [pack_linear_weight(w, rows) for w in ws]
    bf16 = [w.bfloat16() for w in ws]
    bf16_inputs = {k: x.bfloat16() for k, x in inputs.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch marks its quantized tensors deprecated
        int8 = [
            torch.ops.quantized.linear_prepack(
                torch.quantize_per_channel(
                    w,
                    w.abs().amax(1) / 127,
                    torch.zeros(w.shape[0], dtype=torch.long),
                    0,
                    torch.qint8,
                ),
                None,
            )
            for w in ws
        ]
    return {
        "mkl_f32": chain_ms(lambda: [F.linear(inputs[w.shape[1]], w) for w in ws]),
        "onednn_f32": chain_ms(
            lambda: [
                onednn_linear(inputs[w.shape[1]], p, None) for w, p in zip(ws, packed, strict=True)
            ]
        ),
        "bf16": chain_ms(lambda: [F.linear(bf16_inputs[w.shape[1]], w) for w in bf16]),
        "fbgemm_int8": chain_ms(
            lambda: [
                torch.ops.quantized.linear_dynamic(inputs[w.shape[1]], q, True)
                for w, q in zip(ws, int8, strict=True)
            ]
        ),
    }


def bench_llm():
    from baton.app.llm import LLM
    from baton.tools.random_checkpoint import write_checkpoint

    model = write_checkpoint(Path(tempfile.mkdtemp()) / "bench", "llama", "bench")
    return LLM(model, max_num_seqs=64, max_num_batched_tokens=2048)


PROMPT = [7 + i % 50 for i in range(40)]


def step_ms(rounds: int = 4) -> dict[str, float]:
    """Median ms per token of one stream, the C++ layer ops off and on, interleaved."""
    from baton.core.sampling_params import SamplingParams
    from baton.kernels import ops

    llm = bench_llm()
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    kernels_on = ops.uses_cpu_kernels
    llm.generate([PROMPT], params)
    times: dict[str, list[float]] = {"references": [], "cpu_kernels": []}
    for _ in range(rounds):
        for name, times_of in times.items():
            ops.uses_cpu_kernels = kernels_on if name == "cpu_kernels" else (lambda x: False)
            start = time.perf_counter()
            llm.generate([PROMPT], params)
            times_of.append((time.perf_counter() - start) / 64 * 1e3)
    ops.uses_cpu_kernels = kernels_on
    return {name: statistics.median(values) for name, values in times.items()}


def ops_per_step() -> dict[str, tuple[float, float]]:
    from torch.profiler import ProfilerActivity, profile

    from baton.core.sampling_params import SamplingParams
    from baton.kernels import ops

    llm = bench_llm()
    prompt = PROMPT
    prefixes = ("aten::", "baton_cpu::", "mkldnn::")
    kernels_on = ops.uses_cpu_kernels
    counts = {}
    for name in ("references", "cpu_kernels"):
        ops.uses_cpu_kernels = kernels_on if name == "cpu_kernels" else (lambda x: False)
        llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            llm.generate([prompt], SamplingParams(max_tokens=17, temperature=0.0, ignore_eos=True))
        events = [e for e in prof.events() if e.name.startswith(prefixes)]
        top = [
            e for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith(prefixes)
        ]
        counts[name] = (len(top) / 17, len(events) / 17)
        if name == "cpu_kernels":
            common = collections.Counter(e.name for e in top).most_common(8)
            print("most called, per step:", ", ".join(f"{n} {c / 17:.1f}" for n, c in common))
    ops.uses_cpu_kernels = kernels_on
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--ops", action="store_true", help="also count torch ops per step")
    parser.add_argument("--step", action="store_true", help="also time a one-stream step")
    args = parser.parse_args()
    megabytes = sum(w.numel() for w in weights()) * 4 / 1e6
    print(f"bench Llama: {megabytes:.0f} MB of float32 linear weights read per decode step")
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"{threads} thread(s): torch.sum over 256 MB at {bandwidth_gbs():.1f} GB/s")
        for rows in args.rows:
            times = linear_chains(rows)
            print(f"  M={rows:<3} " + "  ".join(f"{k} {v:.2f} ms" for k, v in times.items()))
    if args.step:
        for name, ms in step_ms().items():
            print(f"one stream, {name}: {ms:.2f} ms per token (median of interleaved rounds)")
    if args.ops:
        for name, (top, nested) in ops_per_step().items():
            print(f"torch ops per step, {name}: {top:.1f} top level, {nested:.1f} with nested")


if __name__ == "__main__":
    main()
