"""Head sizes in Triton tiles: which sizes the kernels take, and the mask that lets a head that
is not a power of two run in the next power of two's tile (`tl.arange` needs a power of two)."""

from __future__ import annotations

import triton
import triton.language as tl


def check_head_dim(head_dim: int) -> None:
    """Refuse a head size the Triton kernels are not built for."""
    # Multiples of 8 keep each head's rows 16-byte aligned in 16-bit dtypes: vectorised loads.
    if head_dim < 8 or head_dim % 8:
        raise ValueError(
            f"the Triton kernels take a head size that is a multiple of 8, got {head_dim}; "
            "serve this model on the CPU (--device cpu)"
        )


@triton.jit
def channel_mask(rows_valid, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The mask of a [rows, BLOCK_D] tile's loads and stores: valid rows, and in them only the
    head's HEAD_DIM channels. A power-of-two head fills its tile and gets the row mask alone,
    so its kernel compiles as it would without padding."""
    if HEAD_DIM == BLOCK_D:
        mask = rows_valid[:, None]
    else:
        mask = rows_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
    return mask
