"""Rotary position embedding (NeoX / rotate-half layout) applied in place to q and k, in Triton.

Reads the reference's cos/sin cache ([max_positions, D] float32, cosines then sines, llama3
scaling already folded in by `build_cos_sin_cache`), so both paths rotate by the same angles.
Half a head that is not a power of two is rotated in the next power of two's tile, masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from baton.kernels.head_dim_triton import channel_mask, check_head_dim


@triton.jit
def _rotate_heads(
    x_ptr,
    stride_head,
    num_heads,
    cos,
    sin,
    BLOCK_H: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    offs = heads[:, None] * stride_head + offs_d[None, :]
    mask = channel_mask(heads < num_heads, offs_d, HALF, BLOCK_HALF)
    # Dim i pairs with dim i + D/2 (rotate-half), not with its neighbour (GPT-J interleaving).
    x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    dtype = x_ptr.dtype.element_ty
    tl.store(x_ptr + offs, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(x_ptr + HALF + offs, (x2 * cos + x1 * sin).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    positions_ptr,
    cos_sin_ptr,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_cache,
    num_q_heads,
    num_k_heads,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)
    # Lanes past HALF only meet lanes that are masked off q and k.
    cos_sin = cos_sin_ptr + position * stride_cache + offs
    if HALF == BLOCK_HALF:
        cos = tl.load(cos_sin)[None, :]
        sin = tl.load(cos_sin + HALF)[None, :]
    else:
        cos = tl.load(cos_sin, mask=offs < HALF, other=0.0)[None, :]
        sin = tl.load(cos_sin + HALF, mask=offs < HALF, other=0.0)[None, :]
    _rotate_heads(
        q_ptr + token * stride_q_tok,
        stride_q_head,
        num_q_heads,
        cos,
        sin,
        BLOCK_HQ,
        HALF,
        BLOCK_HALF,
    )
    _rotate_heads(
        k_ptr + token * stride_k_tok,
        stride_k_head,
        num_k_heads,
        cos,
        sin,
        BLOCK_HK,
        HALF,
        BLOCK_HALF,
    )


def apply_rotary_triton(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries [T, Hq, D] and keys [T, Hkv, D] in place by `positions` [T]; returns them.

    q and k may be strided views (slices of a fused qkv projection) with unit stride over D.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    check_head_dim(head_dim)
    if q.stride(-1) != 1 or k.stride(-1) != 1 or not cos_sin_cache.is_contiguous():
        raise ValueError("q and k need unit stride over head_dim, the cos/sin cache contiguous")
    if num_tokens:
        _rotary_kernel[(num_tokens,)](
            q,
            k,
            positions,
            cos_sin_cache,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos_sin_cache.stride(0),
            num_q_heads,
            k.shape[1],
            BLOCK_HQ=triton.next_power_of_2(num_q_heads),
            BLOCK_HK=triton.next_power_of_2(k.shape[1]),
            HALF=head_dim // 2,
            BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        )
    return q, k
