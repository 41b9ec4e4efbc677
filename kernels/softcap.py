"""Logit soft-capping (Gemma 2): `cap * tanh(x / cap)` squashes logits into (-cap, cap) while
keeping small ones almost unchanged. Attention's soft-capping runs inside the attention paths
(kernels/paged_attention.py, kernels/csrc); this is the final logits' and the reference's."""

from __future__ import annotations

import torch


def softcap_ref(x: torch.Tensor, cap: float) -> torch.Tensor:
    """`cap * tanh(x / cap)`, in x's dtype, as transformers computes it."""
    return torch.tanh(x / cap) * cap
