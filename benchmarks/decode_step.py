"""Decode step latency of a real architecture's shape against its memory roofline.

    python benchmarks/decode_step.py                        # GPU: Llama-3.1-8B shape, bf16
    python benchmarks/decode_step.py --device cpu --tiny    # smoke run on a tiny shape

Random weights from a config alone (`--load-format dummy`'s loader), every sequence at
`--context` cached tokens decoding one more. A decode step must read every weight once and every
sequence's K/V once, so `(weight bytes + KV bytes) / copy bandwidth` bounds it from below; the
script reports the step as a multiple of that bound. Steps run through `TorchExecutor.execute`
(inputs, forward, LM head, greedy sampling, reading the tokens back): on CUDA once replaying the
decode CUDA graphs and once eagerly, and the host's share of a step (building its inputs, from
the executor's counters).
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

import torch
from kernel_timing import copy_bandwidth_gbs, describe, time_ms, write_report

from baton.core.batch import Batch, ScheduledSequence
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import EngineConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.device import DTYPES
from baton.gpu.executor import TorchExecutor
from baton.gpu.kv_cache import kv_cache_bytes_per_block

LLAMA_8B = Path(__file__).parent / "configs" / "llama-3.1-8b.json"
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 512,
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(LLAMA_8B), help="a config.json file")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the graphs size attention grids for it (default: context + block size)",
    )
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--bandwidth-gbs", type=float, default=None, help="skip measuring it")
    parser.add_argument("--tiny", action="store_true", help="a tiny shape for a CPU smoke run")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after each batch's timings, the N kernels that took most device time per step "
        "(torch.profiler over a few steps, graphed and eager)",
    )
    args = parser.parse_args()
    if args.tiny:
        args.batches, args.context, args.iters = [1, 8], 128, 3
    if args.device == "cpu":
        args.dtype = "float32"
    return args


def load_config(args: argparse.Namespace, folder: Path) -> ModelConfig:
    raw = TINY if args.tiny else json.loads(Path(args.config).read_text())
    (folder / "config.json").write_text(json.dumps(raw))
    return ModelConfig.from_pretrained(folder)


def decode_batch(batch_size: int, context: int, blocks_per_seq: int) -> Batch:
    """`batch_size` sequences with `context` cached tokens, each decoding its next token."""
    batch = Batch()
    for i in range(batch_size):
        prompt = [1] * context
        batch.sequences.append(
            ScheduledSequence(
                request_id=f"decode-{i}",
                token_ids=[1],
                start_position=context,
                block_table=list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)),
                sample=True,
                sampling_params=SamplingParams(temperature=0.0),
                all_token_ids=prompt,
                num_prompt_tokens=context,
            )
        )
    return batch


def weight_bytes_read(model: torch.nn.Module, batch_size: int) -> int:
    """Bytes of weights a decode step reads: all of them, but only the batch's embedding rows
    when the LM head has its own matrix."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:
        embed = model.embed_tokens.weight
        total -= (embed.shape[0] - batch_size) * embed.shape[1] * embed.element_size()
    return total


def build_executor(args: argparse.Namespace, blocks_per_seq: int) -> TorchExecutor:
    with tempfile.TemporaryDirectory() as folder:
        config = load_config(args, Path(folder))
    engine = EngineConfig(
        max_model_len=args.max_model_len or args.context + args.block_size,
        max_num_seqs=max(args.batches),
        max_num_batched_tokens=max(args.batches),
        block_size=args.block_size,
        num_kv_blocks=max(args.batches) * blocks_per_seq,
    )
    return TorchExecutor(config, engine, args.device, args.dtype, load_format="dummy")


def time_steps(executor: TorchExecutor, batch: Batch, iters: int) -> dict[str, float]:
    """Median step ms (device events on CUDA), and per step from the executor's counters: host
    ms, wall ms and the share of steps that replayed a graph."""
    before = (executor.num_steps, executor.num_graph_steps)
    host, wall = executor.host_time_s, executor.step_time_s
    step_ms = time_ms(lambda: executor.execute(batch), executor.device, iters)
    num_steps = executor.num_steps - before[0]
    return dict(
        step_ms=step_ms,
        host_ms=(executor.host_time_s - host) / num_steps * 1e3,
        wall_ms=(executor.step_time_s - wall) / num_steps * 1e3,
        graph_share=(executor.num_graph_steps - before[1]) / num_steps,
    )


def profile_steps(executor: TorchExecutor, batch: Batch, top: int, label: str) -> None:
    """Print the kernels' busy time per step over a few profiled steps (the step's time above,
    less this, is launch gaps and the host) and the `top` kernels by device time per step."""
    from torch.profiler import ProfilerActivity, profile

    steps = 5
    activities = [ProfilerActivity.CPU]
    if executor.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    executor.execute(batch)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            executor.execute(batch)
        if executor.device.type == "cuda":
            torch.cuda.synchronize(executor.device)
    kernels = [
        e for e in prof.key_averages() if e.device_type.name in ("CUDA", "PrivateUse1")
    ] or list(prof.key_averages())
    kernels.sort(key=lambda e: e.self_device_time_total or e.self_cpu_time_total, reverse=True)
    busy_us = sum(e.self_device_time_total or e.self_cpu_time_total for e in kernels) / steps
    print(f"  {label}: kernels busy {busy_us / 1e3:.3f} ms per step; top {top}:")
    for e in kernels[:top]:
        per_step = (e.self_device_time_total or e.self_cpu_time_total) / steps
        print(f"    {per_step / 1e3:8.3f} ms {e.count // steps:5d}x  {e.key[:90]}")


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    blocks_per_seq = -(-(args.context + 1) // args.block_size)
    executor = build_executor(args, blocks_per_seq)
    device, dtype, model = executor.device, executor.dtype, executor.model
    config = executor.model_config
    kv_bytes_per_token = kv_cache_bytes_per_block(config, args.block_size, dtype) // args.block_size
    bandwidth = args.bandwidth_gbs or copy_bandwidth_gbs(device, 64 if args.tiny else 1024)
    graphs = executor.graphs
    print(
        f"{describe(device)}: {config.architecture} shape from "
        f"{'the tiny preset' if args.tiny else args.config}, {args.dtype}, context {args.context}, "
        f"copy bandwidth {bandwidth:.1f} GB/s, CUDA graphs {'on' if graphs else 'off'}"
    )
    print(
        f"{'batch':>5} {'graph ms':>9} {'eager ms':>9} {'roofline':>9} {'x roof':>7} "
        f"{'host ms':>8} {'host %':>7}"
    )
    rows = []
    for batch_size in args.batches:
        batch = decode_batch(batch_size, args.context, blocks_per_seq)
        graph = time_steps(executor, batch, args.iters) if graphs is not None else None
        # The same executor with its graphs set aside: every step then runs eagerly.
        executor.graphs = None
        eager = time_steps(executor, batch, args.iters)
        executor.graphs = graphs
        best = graph or eager
        read = weight_bytes_read(model, batch_size) + batch_size * args.context * kv_bytes_per_token
        roofline_ms = read / (bandwidth * 1e9) * 1e3
        rows.append(
            dict(
                batch=batch_size,
                graph=graph,
                eager=eager,
                roofline_ms=roofline_ms,
                times_roofline=best["step_ms"] / roofline_ms,
                host_share=best["host_ms"] / best["wall_ms"],
                bytes_read=read,
            )
        )
        graph_ms = f"{graph['step_ms']:>9.3f}" if graph else f"{'-':>9}"
        print(
            f"{batch_size:>5} {graph_ms} {eager['step_ms']:>9.3f} {roofline_ms:>9.3f} "
            f"{best['step_ms'] / roofline_ms:>7.2f} {best['host_ms']:>8.3f} "
            f"{best['host_ms'] / best['wall_ms']:>7.1%}"
        )
        if args.profile:
            if graphs is not None:
                profile_steps(executor, batch, args.profile, "graphs")
            executor.graphs = None
            profile_steps(executor, batch, args.profile, "eager")
            executor.graphs = graphs
    if args.json:
        write_report(args.json, device, bandwidth, args, rows)


if __name__ == "__main__":
    main()
