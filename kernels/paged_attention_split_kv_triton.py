"""Flash-decoding: paged attention for one-token queries with the KV sequence split across programs.

The grid is (sequence, KV head, partition of keys), so a batch of one with a long context still
occupies every SM; a reduce kernel merges the partitions' softmax states. The grid's partition
count is fixed per launch (a CUDA graph fixes it), but each sequence spreads its own keys over
it: its partitions are the fewest whole tiles that fit its length into the grid, so a short
context splits into short partitions too, rather than leaving most programs empty while a few
walk long ones. Partitions past a sequence's end cost an empty program each, not memory traffic.
Attention sinks (gpt-oss) join in the reduce: a head's sink is one more term of its softmax's sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from baton.kernels.head_dim_triton import channel_mask
from baton.kernels.paged_attention_triton import (
    LOG2E,
    NEG_START,
    attend_tile,
    block_d,
    check_layouts,
    dot_precision,
)


@triton.jit
def _partition_size(seq_len, num_partitions, BLOCK_N: tl.constexpr):
    """Keys per partition of a sequence: the fewest whole tiles that spread its `seq_len` keys
    over at most `num_partitions` partitions."""
    return tl.cdiv(tl.maximum(seq_len, 1), BLOCK_N * num_partitions) * BLOCK_N


@triton.jit
def _split_kv_partial_kernel(
    partial_out_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    q_ptr,
    kv_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    qk_scale,
    stride_q_tok,
    stride_q_head,
    stride_kv,
    stride_block,
    stride_slot,
    stride_head,
    stride_table,
    num_heads,
    num_partitions,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    partition_size = _partition_size(seq_len, num_partitions, BLOCK_N)
    tok_start = part * partition_size
    if tok_start >= seq_len:
        return
    tok_end = tl.minimum(tok_start + partition_size, seq_len)

    rows = tl.arange(0, BLOCK_M)
    row_valid = rows < GROUP
    heads = kv_head * GROUP + rows % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = channel_mask(row_valid, offs_d, HEAD_DIM, BLOCK_D)
    q_rows = seq.to(tl.int64) * stride_q_tok + heads * stride_q_head
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_mask, other=0.0)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_START, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # The one query sits at the last position, so every key in the partition is visible.
    query_pos = tl.full([BLOCK_M], 0, dtype=tl.int32) + seq_len - 1
    acc, m_i, l_i = attend_tile(
        q,
        acc,
        m_i,
        l_i,
        kv_ptr,
        block_tables_ptr + seq.to(tl.int64) * stride_table,
        kv_head,
        tok_start,
        tok_end,
        query_pos,
        qk_scale,
        stride_kv,
        stride_block,
        stride_slot,
        stride_head,
        BLOCK_SIZE,
        BLOCK_N,
        HEAD_DIM,
        BLOCK_D,
        DOT_PRECISION,
        0,
        0.0,
        False,
        False,
    )
    # Partials are [seq, head, partition]; partitions past the sequence's end stay unwritten.
    stat = (seq * num_heads + heads).to(tl.int64) * num_partitions + part
    tl.store(partial_max_ptr + stat, m_i, mask=row_valid)
    tl.store(partial_sum_ptr + stat, l_i, mask=row_valid)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(partial_out_ptr + stat[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_mask)


@triton.jit
def _sink_base2(sinks_ptr, head):
    """A head's sink logit in base 2, as the partials' maxima are."""
    return tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634


@triton.jit
def _split_kv_reduce_kernel(
    out_ptr,
    partial_out_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    seq_lens_ptr,
    sinks_ptr,
    stride_o_tok,
    stride_o_head,
    num_heads,
    num_partitions,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_used = tl.cdiv(seq_len, _partition_size(seq_len, num_partitions, BLOCK_N))
    base = (seq * num_heads + head).to(tl.int64) * num_partitions
    global_max = NEG_START
    if HAS_SINKS:
        global_max = tl.maximum(global_max, _sink_base2(sinks_ptr, head))
    for start in range(0, num_used, BLOCK_P):
        parts = start + tl.arange(0, BLOCK_P)
        part_max = tl.load(partial_max_ptr + base + parts, mask=parts < num_used, other=NEG_START)
        global_max = tl.maximum(global_max, tl.max(part_max, axis=0))
    # Rescale each partition's normalised output by its share of the global softmax mass.
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    total = 0.0
    for start in range(0, num_used, BLOCK_P):
        parts = start + tl.arange(0, BLOCK_P)
        in_range = parts < num_used
        part_max = tl.load(partial_max_ptr + base + parts, mask=in_range, other=NEG_START)
        part_sum = tl.load(partial_sum_ptr + base + parts, mask=in_range, other=0.0)
        weights = tl.exp2(part_max - global_max) * part_sum
        part_out = tl.load(
            partial_out_ptr + (base + parts)[:, None] * HEAD_DIM + offs_d[None, :],
            mask=channel_mask(in_range, offs_d, HEAD_DIM, BLOCK_D),
            other=0.0,
        )
        acc += tl.sum(part_out * weights[:, None], axis=0)
        total += tl.sum(weights, axis=0)
    if HAS_SINKS:
        total += tl.exp2(_sink_base2(sinks_ptr, head) - global_max)
    o_offsets = seq.to(tl.int64) * stride_o_tok + head * stride_o_head + offs_d
    o_ptrs = out_ptr + o_offsets
    out = (acc / total).to(out_ptr.dtype.element_ty)
    # One head's row: a padded tile stores its HEAD_DIM channels, not the next head's.
    if HEAD_DIM == BLOCK_D:
        tl.store(o_ptrs, out)
    else:
        tl.store(o_ptrs, out, mask=offs_d < HEAD_DIM)


def paged_decode_split_kv_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float,
    *,
    max_partitions: int,
    sinks: torch.Tensor | None = None,
    block_n: int = 64,
    block_p: int = 64,
) -> torch.Tensor:
    """Flash-decoding: one query token per sequence (q is [B, Hq, D]), KV split in partitions.

    The grid has `min(max_partitions, ceil(max_seq_len / block_n))` partitions per sequence and
    KV head; each sequence cuts its keys into that many or fewer, of whole `block_n`-key tiles.
    Each partition that holds keys writes its softmax max, sum and normalised output in float32;
    the reduce kernel weighs them by `exp(max - global max) * sum`, reading `block_p` partitions
    at a time, and adds each head's sink (`sinks`, [Hq]) to the sum when sinks are given.
    """
    group, block_size, head_dim = check_layouts(q, kv_cache)
    if max_partitions < 1:
        raise ValueError(f"max_partitions must be at least 1, got {max_partitions}")
    num_seqs, num_heads, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    num_partitions = min(max_partitions, triton.cdiv(max_seq_len, block_n))
    stats_shape = (num_seqs, num_heads, num_partitions)
    partial_max = torch.empty(stats_shape, dtype=torch.float32, device=q.device)
    partial_sum = torch.empty(stats_shape, dtype=torch.float32, device=q.device)
    partial_out = torch.empty((*stats_shape, head_dim), dtype=torch.float32, device=q.device)
    num_kv_heads = kv_cache.shape[3]
    _split_kv_partial_kernel[(num_seqs, num_kv_heads, num_partitions)](
        partial_out,
        partial_max,
        partial_sum,
        q,
        kv_cache,
        block_tables,
        seq_lens,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        block_tables.stride(0),
        num_heads,
        num_partitions,
        GROUP=group,
        BLOCK_M=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d(head_dim),
        DOT_PRECISION=dot_precision(q.dtype),
    )
    _split_kv_reduce_kernel[(num_seqs, num_heads)](
        out,
        partial_out,
        partial_max,
        partial_sum,
        seq_lens,
        q if sinks is None else sinks,  # never read without sinks
        out.stride(0),
        out.stride(1),
        num_heads,
        num_partitions,
        BLOCK_N=block_n,
        BLOCK_P=min(block_p, triton.next_power_of_2(num_partitions)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d(head_dim),
        HAS_SINKS=sinks is not None,
    )
    return out
