"""Writing new keys and values into the paged KV cache by slot mapping, in Triton.

Same contract as `write_kv_cache_ref`: token t's K/V [Hkv, D] go to slot `slot_mapping[t]` of the
cache [2, num_blocks, block_size, Hkv, D]; a negative slot (padding) is skipped. A head size that
is not a power of two is copied in the next power of two's tile, its extra channels masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from baton.kernels.head_dim_triton import channel_mask, check_head_dim


@triton.jit
def _write_kv_cache_kernel(
    key_ptr,
    value_ptr,
    kv_ptr,
    slot_mapping_ptr,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kv,
    stride_slot,
    stride_head,
    num_kv_heads,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = channel_mask(heads < num_kv_heads, offs_d, HEAD_DIM, BLOCK_D)
    # Slots index a [num_blocks * block_size] view: the block's slots are contiguous.
    dst = slot * stride_slot + heads[:, None] * stride_head + offs_d[None, :]
    k_src = token * stride_k_tok + heads[:, None] * stride_k_head + offs_d[None, :]
    v_src = token * stride_v_tok + heads[:, None] * stride_v_head + offs_d[None, :]
    tl.store(kv_ptr + dst, tl.load(key_ptr + k_src, mask=mask), mask=mask)
    tl.store(kv_ptr + stride_kv + dst, tl.load(value_ptr + v_src, mask=mask), mask=mask)


def write_kv_cache_triton(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store `key[t]`/`value[t]` [T, Hkv, D] at slot `slot_mapping[t]`; slots < 0 are skipped."""
    num_tokens, num_kv_heads, head_dim = key.shape
    check_head_dim(head_dim)
    if key.stride(-1) != 1 or value.stride(-1) != 1 or not kv_cache.is_contiguous():
        raise ValueError("key/value need unit stride over head_dim; the cache must be contiguous")
    if num_tokens == 0:
        return
    _write_kv_cache_kernel[(num_tokens,)](
        key,
        value,
        kv_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(2),
        kv_cache.stride(3),
        num_kv_heads,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
