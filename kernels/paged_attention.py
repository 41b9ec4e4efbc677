"""Paged attention over a packed batch of variable-length queries, in plain torch.

The reference the Triton kernel is tested against, and the CPU execution path. One function
serves decodes (one query) and prefill chunks (many), with GQA/MQA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Keys and values of one sequence's first `seq_len` tokens, contiguous: [2, seq_len, H, D].

    One `index_select` fetches K and V together: on the CPU the gather is per call, not per byte.
    """
    block_size = kv_cache.shape[2]
    blocks = kv_cache.index_select(1, block_table[: -(-seq_len // block_size)])
    return blocks.flatten(1, 2)[:, :seq_len]


def paged_attention_ref(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """Attention of packed queries `q` [T, Hq, D] over one layer's paged KV cache.

    `kv_cache` is [2, num_blocks, block_size, Hkv, D] (keys, then values). Sequence i owns rows
    `query_start_loc[i]:query_start_loc[i + 1]` of `q`; they are the last tokens of its
    `seq_lens[i]` tokens, whose K/V are already cached at the blocks `block_tables[i]` lists.
    Each query attends causally: to every cached token up to and including its own position.
    """
    out = torch.empty_like(q)
    # CPU index_select is several times slower with int32 indices.
    block_tables = block_tables.long()
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        query_len = end - start
        if query_len == 0:
            continue
        # [2, 1, Hkv, seq_len, D]: SDPA wants heads before tokens, and its fast CPU kernel
        # wants 4-d inputs (3-d ones fall back to a path twice as slow).
        k, v = gather_kv(kv_cache, block_tables[i], seq_len).transpose(1, 2).unsqueeze(1)
        mask = None
        if query_len > 1:
            # Query j sits at position seq_len - query_len + j: a causal mask aligned to the end.
            query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
            key_pos = torch.arange(seq_len, device=q.device)
            mask = key_pos[None, :] <= query_pos[:, None]
        attended = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1).unsqueeze(0),
            k,
            v,
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = attended[0].transpose(0, 1)
    return out
