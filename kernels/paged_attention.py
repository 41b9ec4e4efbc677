"""Paged attention over a packed batch of variable-length queries, in plain torch.

The reference the Triton kernel is tested against, and the CPU execution path. One function
serves decodes (one query) and prefill chunks (many), with GQA/MQA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first `seq_len` cached tokens of one sequence, contiguous: [seq_len, Hkv, D]."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = cache.index_select(0, block_table[:num_blocks])
    return blocks.flatten(0, 1)[:seq_len]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """Attention of packed queries `q` [T, Hq, D] over the paged KV cache.

    Sequence i owns rows `query_start_loc[i]:query_start_loc[i + 1]` of `q`; they are the last
    tokens of its `seq_lens[i]` tokens, whose K/V are already in `k_cache`/`v_cache`
    [num_blocks, block_size, Hkv, D] at the blocks `block_tables[i]` lists. Each query attends
    causally: to every cached token up to and including its own position.
    """
    out = torch.empty_like(q)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        query_len = end - start
        if query_len == 0:
            continue
        k = _gather_kv(k_cache, block_tables[i], seq_len)
        v = _gather_kv(v_cache, block_tables[i], seq_len)
        mask = None
        if query_len > 1:
            # Query j sits at position seq_len - query_len + j: a causal mask aligned to the end.
            query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
            key_pos = torch.arange(seq_len, device=q.device)
            mask = key_pos[None, :] <= query_pos[:, None]
        # SDPA wants heads before tokens: [1, H, tokens, D].
        attended = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = attended.squeeze(0).transpose(0, 1)
    return out
