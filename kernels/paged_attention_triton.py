"""Paged attention over a packed batch of variable-length queries, in Triton.

One kernel for decodes and prefill chunks, with `paged_attention_ref`'s contract: a program
takes a tile of one sequence's query tokens times the query heads of one KV head (so GQA reads
K/V once per group) and streams the sequence's K/V with an online softmax, causally masked,
within a sliding window when one is given (keys behind the tile's window are not read), with
scores soft-capped when asked (Gemma 2), and with each query head's sink logit in the softmax's
denominator when sinks are given (gpt-oss). A head size that is not a power of two runs in the
next power of two's tile, its extra channels masked off every load and store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from baton.kernels.head_dim_triton import channel_mask, check_head_dim

# Scores use exp2: scale folded with log2(e) so the softmax costs one multiply per score.
LOG2E = 1.4426950408889634
# The running max starts finite so a row with no visible key yet does no (-inf) - (-inf).
NEG_START = tl.constexpr(-1.0e30)


@triton.jit
def attend_tile(
    q,
    acc,
    m_i,
    l_i,
    kv_ptr,
    block_table_ptr,
    kv_head,
    tok_start,
    tok_end,
    query_pos,
    qk_scale,
    stride_kv,
    stride_block,
    stride_slot,
    stride_head,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    window=0,
    softcap=0.0,
    HAS_WINDOW: tl.constexpr = False,
    HAS_SOFTCAP: tl.constexpr = False,
):
    """Fold the keys/values of tokens `tok_start:tok_end` into the online softmax state.

    `qk_scale` is the softmax scale times log2(e), or with HAS_SOFTCAP the plain scale: the cap
    applies to natural-unit scores, which are then brought to base 2. Channels past HEAD_DIM
    load as zeros, so they add nothing to a score nor to the values."""
    offs_d = tl.arange(0, BLOCK_D)
    for start in range(tok_start, tok_end, BLOCK_N):
        toks = start + tl.arange(0, BLOCK_N)
        in_range = toks < tok_end
        # A tile may span several cache blocks: each token finds its own block and offset.
        block_ids = tl.load(block_table_ptr + toks // BLOCK_SIZE, mask=in_range, other=0)
        token_offsets = (
            block_ids.to(tl.int64) * stride_block
            + (toks % BLOCK_SIZE) * stride_slot
            + kv_head * stride_head
        )
        kv_offsets = token_offsets[:, None] + offs_d[None, :]
        kv_mask = channel_mask(in_range, offs_d, HEAD_DIM, BLOCK_D)
        k = tl.load(kv_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(kv_ptr + stride_kv + kv_offsets, mask=kv_mask, other=0.0)

        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if HAS_SOFTCAP:
            # cap * tanh(s / cap), with tanh(x) = 2 sigmoid(2x) - 1; then base 2.
            scores = softcap * (2.0 * tl.sigmoid(2.0 * scores / softcap) - 1.0)
            scores = scores * 1.4426950408889634
        visible = (toks[None, :] <= query_pos[:, None]) & in_range[None, :]
        if HAS_WINDOW:
            visible = visible & (toks[None, :] > query_pos[:, None] - window)
        scores = tl.where(visible, scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION).to(
            tl.float32
        )
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def fold_sinks(acc, m_i, l_i, sinks_ptr, heads, row_valid):
    """Fold each row's head's sink logit (natural units) into the online softmax state as one
    more score that adds to the sum and nothing to the values."""
    sink = tl.load(sinks_ptr + heads, mask=row_valid, other=0.0).to(tl.float32) * 1.4426950408889634
    m_new = tl.maximum(m_i, sink)
    alpha = tl.exp2(m_i - m_new)
    return acc * alpha[:, None], m_new, l_i * alpha + tl.exp2(sink - m_new)


@triton.jit
def _paged_attention_kernel(
    out_ptr,
    q_ptr,
    kv_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    sinks_ptr,
    qk_scale,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_kv,
    stride_block,
    stride_slot,
    stride_head,
    stride_table,
    window,
    softcap,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_begin = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    if q_tile * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    # Row r of the tile is query token r // GROUP under query head kv_head * GROUP + r % GROUP.
    rows = tl.arange(0, BLOCK_M)
    q_idx = q_tile * BLOCK_Q + rows // GROUP
    row_valid = (rows < BLOCK_Q * GROUP) & (q_idx < query_len)
    heads = kv_head * GROUP + rows % GROUP
    query_pos = context_len + q_idx
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = channel_mask(row_valid, offs_d, HEAD_DIM, BLOCK_D)

    q_rows = (q_begin + q_idx).to(tl.int64) * stride_q_tok + heads * stride_q_head
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_mask, other=0.0)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_START, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Keys past the tile's last query position are masked for every row: skip them.
    last_query = tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, query_len)
    # Keys behind the window of the tile's first query are masked for every row: skip them too.
    first_key = 0
    if HAS_WINDOW:
        first_key = tl.maximum(context_len + q_tile * BLOCK_Q - window + 1, 0)
    acc, m_i, l_i = attend_tile(
        q,
        acc,
        m_i,
        l_i,
        kv_ptr,
        block_tables_ptr + seq.to(tl.int64) * stride_table,
        kv_head,
        first_key,
        context_len + last_query,
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
        window,
        softcap,
        HAS_WINDOW,
        HAS_SOFTCAP,
    )
    if HAS_SINKS:
        acc, m_i, l_i = fold_sinks(acc, m_i, l_i, sinks_ptr, heads, row_valid)
    out = acc / tl.where(row_valid, l_i, 1.0)[:, None]
    o_rows = (q_begin + q_idx).to(tl.int64) * stride_o_tok + heads * stride_o_head
    tl.store(
        out_ptr + o_rows[:, None] + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask,
    )


def block_d(head_dim: int) -> int:
    """The attention tile's channel extent: a power of two (tl.arange) of at least 16 (tl.dot)."""
    return max(16, triton.next_power_of_2(head_dim))


def check_layouts(q: torch.Tensor, kv_cache: torch.Tensor) -> tuple[int, int, int]:
    """(group size, block size, head dim), after checking what the kernels assume."""
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    num_heads = q.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not split into {num_kv_heads} KV groups")
    check_head_dim(head_dim)
    if q.stride(-1) != 1 or not kv_cache.is_contiguous():
        raise ValueError("q needs unit stride over head_dim and the KV cache must be contiguous")
    return num_heads // num_kv_heads, block_size, head_dim


def dot_precision(dtype: torch.dtype) -> str:
    # float32 runs in the interpreter tests against the reference: exact products, not TF32.
    return "ieee" if dtype == torch.float32 else "tf32"


def paged_attention_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    *,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> torch.Tensor:
    """Causal paged attention of packed queries `q` [T, Hq, D]: returns [T, Hq, D].

    `query_start_loc` [B + 1] and `seq_lens` [B] are int32 tensors on q's device;
    `max_query_len` sizes the grid. A tile holds `block_m` rows (query tokens x group heads).
    `window`, `softcap` and `sinks` ([Hq] on q's device) as `paged_attention_ref`'s.
    """
    group, block_size, head_dim = check_layouts(q, kv_cache)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or q.shape[0] == 0:
        return out
    # Enough rows for at least one query token's group; decodes need no more than that.
    block_m = max(16, triton.next_power_of_2(group * min(max_query_len, max(1, block_m // group))))
    block_q = block_m // group
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), kv_cache.shape[3])
    _paged_attention_kernel[grid](
        out,
        q,
        kv_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        q if sinks is None else sinks,  # never read without sinks
        scale if softcap is not None else scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        block_tables.stride(0),
        window or 0,
        softcap or 0.0,
        GROUP=group,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d(head_dim),
        DOT_PRECISION=dot_precision(q.dtype),
        HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
    )
    return out
