"""Writing new keys and values into the paged KV cache by slot mapping, in plain torch."""

from __future__ import annotations

import torch


def write_kv_cache_ref(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store token t's `key[t]`/`value[t]` [T, Hkv, D] at slot `slot_mapping[t]` of the cache.

    `kv_cache` is [2, num_blocks, block_size, Hkv, D]; a slot is `block_id * block_size +
    offset`; negative slots mark padding tokens, which are not stored. Keys and values are
    rounded to the cache's dtype where it differs (a float16 cache under a float32 model).
    """
    key, value = key.to(kv_cache.dtype), value.to(kv_cache.dtype)
    if bool((slot_mapping < 0).any()):
        stored = slot_mapping >= 0
        key, value, slot_mapping = key[stored], value[stored], slot_mapping[stored]
    # index_copy_ along dim 0 of the flat slot view: on the CPU, faster than masked assignment.
    flat = kv_cache.view(2, -1, *kv_cache.shape[3:])
    slots = slot_mapping.long()  # index_copy_ takes only int64 indices; no copy when already so
    flat[0].index_copy_(0, slots, key)
    flat[1].index_copy_(0, slots, value)
