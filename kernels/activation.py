"""The gated activations of Llama-style (SiLU) and Gemma (GeLU, tanh approximation) MLPs, in
plain torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `x` = [gate | up] along the last dim: [T, 2I] -> [T, I]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """`gelu_tanh(gate) * up` (GeGLU, as Gemma's `gelu_pytorch_tanh`): [T, 2I] -> [T, I]."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
