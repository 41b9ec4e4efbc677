"""RMSNorm, alone and with the residual add fused in, in plain torch with Hugging Face numerics."""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`x / rms(x) * weight` over the last dim, computed in float32 and cast back to x's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    # Cast before scaling, as transformers does, so low-precision results match it bit for bit.
    return weight * normed.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add `x` into the residual stream, then normalize it: (normed, new_residual)."""
    # The add happens in the model dtype, as in transformers' decoder layers.
    new_residual = x + residual
    return rms_norm_ref(new_residual, weight, eps), new_residual
