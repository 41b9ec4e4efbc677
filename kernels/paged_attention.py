"""Paged attention over a packed batch of variable-length queries, in plain torch.

The reference the Triton kernel is tested against, and the CPU execution path. One function
serves decodes (one query) and prefill chunks (many), with GQA/MQA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    # Blocks are gathered as rows of 2-d views: CPU index_select is fastest along dim 0 of a
    # 2-d tensor (measured: 10-25% faster than over the 4-d cache or than K and V in one call
    # along dim 1; int32 and int64 indices measured the same).
    k_rows = kv_cache[0].view(num_blocks, -1)
    v_rows = kv_cache[1].view(num_blocks, -1)
    # SDPA wants [1, heads, tokens, D]; its fast CPU kernel only takes 4-d inputs.
    queries = q.transpose(0, 1).unsqueeze(0)
    outputs = []
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if start == end:
            continue
        used = block_tables[i, : -(-seq_len // block_size)]
        k = k_rows.index_select(0, used).view(1, -1, num_kv_heads, head_dim)[:, :seq_len]
        v = v_rows.index_select(0, used).view(1, -1, num_kv_heads, head_dim)[:, :seq_len]
        mask = None
        if end - start > 1:
            # Query j sits at position seq_len - query_len + j: a causal mask aligned to the end.
            query_pos = torch.arange(seq_len - (end - start), seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= query_pos[:, None]
        outputs.append(
            F.scaled_dot_product_attention(
                queries[:, :, start:end],
                k.transpose(1, 2),
                v.transpose(1, 2),
                attn_mask=mask,
                scale=scale,
                enable_gqa=True,
            )
        )
    if not outputs:
        return torch.empty_like(q)
    # One concatenation instead of a copy into the output per sequence.
    return torch.cat(outputs, dim=2)[0].transpose(0, 1)
