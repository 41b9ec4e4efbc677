"""Rotary position embedding (NeoX / rotate-half layout, as Llama and Qwen use), in plain torch.

The cos/sin cache holds, per position, the cosines then the sines of its rotation angles, in
float32; llama3 frequency scaling is applied when the checkpoint asks for it.
"""

from __future__ import annotations

import math

import torch

from core.model_config import RopeConfig


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """The rotation frequency of each pair of dims, [head_dim // 2] float32 on the CPU."""
    # An explicit device, so a model built under `torch.device("meta")` still gets real values.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "llama3":
        inv_freq = _llama3_scaled(inv_freq, rope)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """Stretch long wavelengths by `factor`, keep short ones, blend smoothly in between."""
    wavelen = 2 * math.pi / inv_freq
    short_limit = rope.original_max_position_embeddings / rope.high_freq_factor
    long_limit = rope.original_max_position_embeddings / rope.low_freq_factor
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * inv_freq / rope.factor + smooth * inv_freq
    scaled = torch.where(wavelen > long_limit, inv_freq / rope.factor, blended)
    return torch.where(wavelen < short_limit, inv_freq, scaled)


def build_cos_sin_cache(
    rope: RopeConfig, head_dim: int, max_positions: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """[max_positions, head_dim]: cos of each angle in the first half, sin in the second."""
    inv_freq = rope_inv_freq(rope, head_dim)
    positions = torch.arange(max_positions, dtype=torch.float32, device="cpu")
    angles = positions[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Dim i pairs with dim i + D/2 (rotate-half), not with its neighbour (GPT-J interleaving).
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def apply_rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries [T, Hq, D] and keys [T, Hkv, D] by their tokens' `positions` [T]."""
    cos, sin = cos_sin_cache[positions].to(q.dtype).unsqueeze(1).chunk(2, dim=-1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
