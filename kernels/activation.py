"""The gated SiLU of Llama-style MLPs, in plain torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `x` = [gate | up] along the last dim: [T, 2I] -> [T, I]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
