"""RMSNorm, alone and with the residual add fused in, in Triton, with the reference's numerics.

Like `rms_norm_ref`: the statistics in float32, the normalised row cast to the model dtype
before the weight multiplies it; the fused add rounds its sum to the model dtype first, as the
residual stream is kept in that dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    out_ptr,
    residual_out_ptr,
    x_ptr,
    residual_ptr,
    weight_ptr,
    eps,
    hidden_size,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * hidden_size
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    mean_square = tl.sum(x32 * x32, axis=0) / hidden_size
    normed = (x32 * tl.rsqrt(mean_square + eps)).to(x.dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = weight.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden_size = x.shape[-1]
    # One program per row of a contiguous [rows, hidden] view (q/k slices are copied first).
    rows = x.reshape(-1, hidden_size).contiguous()
    out = torch.empty_like(rows)
    residual_rows = residual_out = None
    if residual is not None:
        residual_rows = residual.reshape(-1, hidden_size).contiguous()
        residual_out = torch.empty_like(rows)
    block = triton.next_power_of_2(hidden_size)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](
            out,
            residual_out,
            rows,
            residual_rows,
            weight,
            eps,
            hidden_size,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            # A whole row per program: wide rows (4096 for an 8B) need more than 4 warps.
            num_warps=min(max(block // 512, 1), 16),
        )
    new_residual = None if residual_out is None else residual_out.view(x.shape)
    return out.view(x.shape), new_residual


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`x / rms(x) * weight` over the last dim."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add `x` into the residual stream, then normalize it: (normed, new_residual)."""
    out, new_residual = _launch(x, residual, weight, eps)
    assert new_residual is not None
    return out, new_residual
