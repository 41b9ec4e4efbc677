"""Paged attention over a packed batch of variable-length queries, in plain torch.

`paged_attention_ref` is the reference the Triton kernels are tested against: one SDPA call per
sequence. `paged_attention_cpu` is the CPU path: every row of the step, prefill chunks' and
decodes', in one call of the C++ kernel (kernels/csrc), each row with its own causal length;
where that kernel cannot build or the dtype is not float32, prefill chunks as the reference and
decodes batched into a few padded SDPA calls. How a step splits is a `CpuAttentionPlan`
(kernels/cpu_attention_plan.py). Every path takes a sliding window, Gemma 2's soft-capping of
scores and gpt-oss's attention sinks, per call (layers differ).
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from baton.kernels.cpu_attention_plan import CpuAttentionPlan, DecodeGroup, cpu_attention_plan
from baton.kernels.softcap import softcap_ref


class _GatherBuffer(threading.local):
    """Per thread, one reused buffer for the padded path's gathered K and V.

    Reused because gathering into fresh memory pays a page fault per page (docs/decisions.md);
    scratch only: its contents live until a group's SDPA returns, so no call depends on another.
    """

    buffer: torch.Tensor | None = None

    def take(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        buffer = self.buffer
        if (
            buffer is None
            or buffer.numel() < numel
            or buffer.dtype != like.dtype
            or buffer.device != like.device
        ):
            # A normal tensor, not an inference one, so it can be written in and out of
            # inference mode alike.
            with torch.inference_mode(False):
                buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self.buffer = buffer
        return buffer[:numel]


_gather_buffer = _GatherBuffer()


def paged_attention_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of packed queries `q` [T, Hq, D] over one layer's paged KV cache.

    `kv_cache` is [2, num_blocks, block_size, Hkv, D] (keys, then values). Sequence i owns rows
    `query_start_loc[i]:query_start_loc[i + 1]` of `q`; they are the last tokens of its
    `seq_lens[i]` tokens, whose K/V are already cached at the blocks `block_tables[i]` lists.
    Each query attends causally: to every cached token up to and including its own position,
    and with a `window` only to the last `window` of those (transformers' sliding window: key j
    is seen from position p when p - window < j <= p). With `softcap`, scores (after `scale`)
    become `softcap * tanh(score / softcap)` before the softmax, as Gemma 2's do. With `chunk`,
    a query sees only the keys of its own chunk (Llama 4's chunked attention: key j is seen from
    position p when p // chunk * chunk <= j <= p). With `sinks` ([Hq], gpt-oss's attention
    sinks), each query head's sink logit joins its softmax's denominator as one more score that
    carries no value, so the weights sum to less than one.
    """
    outputs = [
        _attend_sequence(
            q[start:end], kv_cache, block_tables[i], seq_len, scale, window, softcap, chunk, sinks
        )
        for i, seq_len in enumerate(seq_lens)
        if (start := query_start_loc[i]) < (end := query_start_loc[i + 1])
    ]
    if not outputs:
        return torch.empty_like(q)
    # One concatenation instead of a copy into the output per sequence.
    return torch.cat(outputs)


def paged_attention_cpu(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    scale: float,
    plan: CpuAttentionPlan | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """`paged_attention_ref`'s contract: every row in one C++ kernel call; without the kernel,
    prefill chunks one SDPA call each and decodes batched by length bucket into padded SDPA
    calls, or one sequence at a time where a window, soft-capping or sinks apply.

    `plan` is this batch's `cpu_attention_plan`; without one, a plan is made for this call.
    """
    if plan is None:
        plan = cpu_attention_plan(
            block_tables, query_start_loc, seq_lens, kv_cache.shape[2], q.dtype
        )
    cache_dtypes = (q.dtype, torch.float16) if q.dtype == torch.float32 else (q.dtype,)
    if (
        q.dtype != plan.dtype
        or kv_cache.dtype not in cache_dtypes
        or kv_cache.shape[2] != plan.block_size
    ):
        raise ValueError(
            f"the attention plan is for {plan.dtype} and blocks of {plan.block_size} tokens, "
            f"but q is {q.dtype} and the cache {kv_cache.dtype} with blocks of "
            f"{kv_cache.shape[2]}: build the step's inputs with the model's dtype and block size "
            "(the cache is in that dtype, or float16 under float32)"
        )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if plan.use_kernel:
        if plan.kernel_rows.numel():
            torch.ops.baton_cpu.paged_attention(
                out,
                q,
                kv_cache,
                block_tables,
                plan.kernel_lens,
                plan.kernel_rows,
                plan.kernel_seqs,
                scale,
                window or 0,
                softcap or 0.0,
                None if sinks is None else sinks.float(),
            )
        return out
    for i, start, end in plan.prefills:
        out[start:end] = _attend_sequence(
            q[start:end],
            kv_cache,
            block_tables[i],
            seq_lens[i],
            scale,
            window,
            softcap,
            sinks=sinks,
        )
    if window is not None or softcap is not None or sinks is not None:
        # The padded groups' masks and SDPA calls are for plain causal attention.
        for i in plan.padded_decode_seqs:
            row = query_start_loc[i]
            out[row : row + 1] = _attend_sequence(
                q[row : row + 1],
                kv_cache,
                block_tables[i],
                seq_lens[i],
                scale,
                window,
                softcap,
                sinks=sinks,
            )
        return out
    for group in plan.decode_groups:
        out.index_copy_(0, group.rows, _attend_decode_group(q, kv_cache, group, scale))
    return out


def _attend_sequence(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One sequence's queries [Tq, Hq, D], the last Tq of its `seq_len` tokens, attending."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    query_len = q.shape[0]
    # With a window or chunks, blocks wholly before the first query's keys are not read at all.
    first_block = 0
    if window is not None:
        first_block = max(0, seq_len - query_len - window + 1) // block_size
    if chunk is not None:
        first_block = max(first_block, (seq_len - query_len) // chunk * chunk // block_size)
    first_key = first_block * block_size
    used = block_table[first_block : -(-seq_len // block_size)]
    # Rows of 2-d views: CPU index_select is fastest along dim 0 of a 2-d tensor.
    k = kv_cache[0].view(num_blocks, -1).index_select(0, used)
    v = kv_cache[1].view(num_blocks, -1).index_select(0, used)
    # A float16 cache under a float32 model is widened once gathered (a no-op otherwise).
    k = k.view(1, -1, num_kv_heads, head_dim)[:, : seq_len - first_key].to(q.dtype)
    v = v.view(1, -1, num_kv_heads, head_dim)[:, : seq_len - first_key].to(q.dtype)
    mask = None
    if query_len > 1 or window is not None or chunk is not None:
        # Query j sits at position seq_len - query_len + j: a causal mask aligned to the end.
        query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)[:, None]
        key_pos = torch.arange(first_key, seq_len, device=q.device)[None, :]
        mask = key_pos <= query_pos
        if window is not None:
            mask &= key_pos > query_pos - window
        if chunk is not None:
            mask &= key_pos >= query_pos // chunk * chunk
    # SDPA wants [1, heads, tokens, D]; its fast CPU kernel only takes 4-d inputs.
    q4, k4, v4 = q.transpose(0, 1).unsqueeze(0), k.transpose(1, 2), v.transpose(1, 2)
    if softcap is not None or sinks is not None:
        return _written_out_attention(q4, k4, v4, mask, scale, softcap, sinks)[0].transpose(0, 1)
    out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def _written_out_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attention over [1, heads, tokens, D] inputs with Gemma 2's capped scores or gpt-oss's
    sinks, written out (SDPA has neither): scores, cap, mask, float32 softmax with each head's
    sink as one more column, weighted values."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if softcap is not None:
        scores = softcap_ref(scores, softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    else:
        sink_column = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores.float(), sink_column], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs.to(q.dtype), v)


def _attend_decode_group(
    q: torch.Tensor, kv_cache: torch.Tensor, group: DecodeGroup, scale: float
) -> torch.Tensor:
    """The group's single queries [B, Hq, D], each over its first `seq_len` tokens.

    All B sequences gather `padded_len` tokens' blocks in one `index_select`. Table entries past a
    sequence's own blocks must be valid block ids (the packed batch pads its tables with block 0)
    and columns past the table's width read block 0: the cache holds only finite values (it is
    allocated zeroed and written with real K/V), so the length mask hides them exactly. Each KV
    head's group of query heads stands as that head's queries in one SDPA call, so GQA needs no
    copies of K and V.
    """
    _, num_blocks, _, num_kv_heads, head_dim = kv_cache.shape
    num_seqs, num_rows = group.rows.numel(), group.blocks.numel()
    k_rows = kv_cache[0].view(num_blocks, -1)
    v_rows = kv_cache[1].view(num_blocks, -1)
    gathered = _gather_buffer.take(2 * num_rows * k_rows.shape[1], kv_cache)
    k_out, v_out = gathered.view(2, num_rows, -1)
    k = torch.index_select(k_rows, 0, group.blocks, out=k_out)
    v = torch.index_select(v_rows, 0, group.blocks, out=v_out)
    shape = (num_seqs, group.padded_len, num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        q.index_select(0, group.rows).view(num_seqs, num_kv_heads, -1, head_dim),
        k.view(shape).transpose(1, 2).to(q.dtype),
        v.view(shape).transpose(1, 2).to(q.dtype),
        attn_mask=group.key_bias,
        scale=scale,
    )
    return out.view(num_seqs, -1, head_dim)
