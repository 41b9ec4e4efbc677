"""Writing new keys and values into the paged KV cache by slot mapping, in plain torch."""

from __future__ import annotations

import torch


def write_kv_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store token t's `key[t]`/`value[t]` [T, Hkv, D] at slot `slot_mapping[t]` of the caches.

    A slot is `block_id * block_size + offset` into the [num_blocks, block_size, Hkv, D] caches;
    negative slots mark padding tokens, which are not stored.
    """
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[valid]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[valid]
