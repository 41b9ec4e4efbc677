"""Paged decode attention: achieved bandwidth (bytes read / time) against the card's copy bandwidth.

    python benchmarks/kernel_attention.py                       # GPU: Llama-3.1-8B heads, bf16
    python benchmarks/kernel_attention.py --num-kv-heads 32 --head-dims 128 96 80 192
                                                                # heads that pad to a power of two
    python benchmarks/kernel_attention.py --device cpu --tiny   # smoke run: Triton interpreted

One query token per sequence over a paged cache with shuffled blocks, for each batch size and
context length: the Triton kernel (unified and split-KV) and the torch reference, each checked
against the reference. Decode attention reads every cached K/V once, so bytes read / time over the
measured copy bandwidth says how close it gets to the memory roofline; a head size that is not a
power of two runs in a padded tile and reads only its own channels, so its fraction of the copy
bandwidth beside a power of two's shows what the padding costs. On the CPU the figures
only prove the script works: the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import argparse
import os

import torch
from kernel_timing import copy_bandwidth_gbs, describe, time_ms, write_report

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="small shapes for a CPU smoke run")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument(
        "--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768]
    )
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--impls", nargs="+", default=["unified", "split", "torch"])
    parser.add_argument(
        "--partitions",
        type=int,
        nargs="+",
        default=[],
        help="also time the split-KV kernel with at most these many partitions (as split-N)",
    )
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument(
        "--max-kv-gib", type=float, default=40.0, help="skip shapes whose cache is larger"
    )
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    if args.tiny:
        args.batches, args.contexts = [1, 4], [64, 256]
        args.num_heads, args.num_kv_heads, args.head_dims = 8, 2, [64, 96]
        args.iters = 2
    if args.device == "cpu":
        args.dtype = "float32"  # the interpreter's bfloat16 is not faithful
    return args


def measure(
    args, head_dim: int, batch: int, context: int, bandwidth: float, num_sms: int
) -> list[dict]:
    """Time every implementation on one (head size, batch, context) shape; [] when it does not
    fit."""
    from baton.kernels.ops import split_kv_max_partitions, use_split_kv
    from baton.kernels.paged_attention import paged_attention_ref
    from baton.kernels.paged_attention_split_kv_triton import paged_decode_split_kv_triton
    from baton.kernels.paged_attention_triton import paged_attention_triton

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    blocks_per_seq = -(-context // args.block_size)
    num_blocks = batch * blocks_per_seq
    kv_shape = (2, num_blocks, args.block_size, args.num_kv_heads, head_dim)
    kv_bytes = torch.Size(kv_shape).numel() * dtype.itemsize
    if kv_bytes > args.max_kv_gib * 2**30:
        print(f"{head_dim:>4} {batch:>5} {context:>7} skipped: {kv_bytes / 2**30:.1f} GiB of KV")
        return []
    kv_cache = torch.empty(kv_shape, dtype=dtype, device=device).normal_()
    # Shuffled blocks, as a long-running block pool hands them out.
    block_tables = (
        torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq).to(torch.int32)
    )
    q = torch.randn(batch, args.num_heads, head_dim, dtype=dtype, device=device)
    seq_lens, query_start_loc = [context] * batch, list(range(batch + 1))
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    query_start_loc_t = torch.tensor(query_start_loc, dtype=torch.int32, device=device)
    scale = head_dim**-0.5

    def split_kv_at(partitions: int):
        return lambda: paged_decode_split_kv_triton(
            q, kv_cache, block_tables, seq_lens_t, context, scale, max_partitions=partitions
        )

    impls = {
        "unified": lambda: paged_attention_triton(
            q, kv_cache, block_tables, query_start_loc_t, seq_lens_t, 1, scale
        ),
        "split": split_kv_at(split_kv_max_partitions(batch, args.num_kv_heads, num_sms)),
        "torch": lambda: paged_attention_ref(
            q, kv_cache, block_tables, query_start_loc, seq_lens, scale
        ),
    }
    impls |= {f"split-{size}": split_kv_at(size) for size in args.partitions}
    expected = impls["torch"]().float()
    read_bytes = kv_bytes + 2 * q.numel() * dtype.itemsize  # K/V and q read, output written
    split = use_split_kv(batch, args.num_kv_heads, context, num_sms)
    dispatch = "split" if split else "unified"
    rows = []
    for name in args.impls + [f"split-{size}" for size in args.partitions]:
        err = (impls[name]().float() - expected).abs().max().item()
        # The Triton kernels replay from a CUDA graph, as a served decode step runs them; the
        # reference's per-sequence loop runs as it is.
        graph = name != "torch"
        ms = time_ms(impls[name], device, args.iters, warmup=1 if args.tiny else 3, graph=graph)
        gbs = read_bytes / (ms * 1e-3) / 1e9
        rows.append(
            dict(
                head_dim=head_dim,
                batch=batch,
                context=context,
                impl=name,
                dispatched=name == dispatch,
                ms=ms,
                gb_per_s=gbs,
                fraction_of_copy=gbs / bandwidth,
                max_abs_err=err,
            )
        )
        mark = "*" if name == dispatch else " "
        print(
            f"{head_dim:>4} {batch:>5} {context:>7} {name + mark:>10} {ms:>9.4f} {gbs:>8.1f} "
            f"{gbs / bandwidth:>7.1%} {err:>8.1e}"
        )
    return rows


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        # Read when the kernels are decorated, so it must precede their import.
        os.environ["TRITON_INTERPRET"] = "1"
    bandwidth = copy_bandwidth_gbs(device, 64 if args.tiny else 1024)
    from baton.kernels import ops

    num_sms = ops.device_num_sms(device)
    print(f"{describe(device)}: copy bandwidth {bandwidth:.1f} GB/s, {args.dtype}")
    print(
        f"{'d':>4} {'batch':>5} {'context':>7} {'impl':>10} {'ms':>9} {'GB/s':>8} "
        f"{'of copy':>7} {'err':>8}"
    )
    rows = []
    for head_dim in args.head_dims:
        for context in args.contexts:
            for batch in args.batches:
                rows += measure(args, head_dim, batch, context, bandwidth, num_sms)
    print("* = what baton.kernels.ops.paged_attention picks for this shape")
    if args.json:
        write_report(args.json, device, bandwidth, args, rows)


if __name__ == "__main__":
    main()
