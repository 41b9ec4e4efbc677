"""Writing new keys and values into the paged KV cache by slot mapping, in plain torch."""

from __future__ import annotations

import torch


def write_kv_cache_ref(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store token t's `key[t]`/`value[t]` [T, Hkv, D] at slot `slot_mapping[t]` of the cache.

    `kv_cache` is [2, num_blocks, block_size, Hkv, D]; a slot is `block_id * block_size +
    offset`; negative slots mark padding tokens, which are not stored.
    """
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    flat = kv_cache.view(2, -1, *kv_cache.shape[3:])
    flat[0, slots] = key[valid]
    flat[1, slots] = value[valid]
