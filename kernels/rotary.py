"""Rotary position embedding (NeoX / rotate-half layout, as Llama and Qwen use), in plain torch.

The cos/sin cache holds, per position, the cosines then the sines of its rotation angles, in
float32, with the checkpoint's frequency scaling (baton.core.checkpoint.rope_config's types)
applied.
"""

from __future__ import annotations

import math

import torch

from baton.core.checkpoint.rope_config import RopeConfig


def rope_inv_freq(rope: RopeConfig, head_dim: int, seq_len: int | None = None) -> torch.Tensor:
    """The rotation frequency of each pair of dims, [head_dim // 2] float32 on the CPU.

    `seq_len` matters to dynamic and longrope only, whose frequencies depend on how long the
    sequence has grown (transformers recomputes them once a sequence passes the original
    context)."""
    # An explicit device, so a model built under `torch.device("meta")` still gets real values.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
    theta = rope.theta
    original = rope.original_max_position_embeddings
    if rope.rope_type == "dynamic" and seq_len is not None and seq_len > original:
        stretch = rope.factor * seq_len / original - (rope.factor - 1)
        theta = theta * stretch ** (head_dim / (head_dim - 2))
    base_freq = theta**exponents
    if rope.rope_type == "linear":
        return 1.0 / base_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(1.0 / base_freq, rope)
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(base_freq, rope, head_dim)
    if rope.rope_type == "longrope":
        long = seq_len is not None and seq_len > original
        factors = torch.tensor(rope.long_factor if long else rope.short_factor, device="cpu")
        return 1.0 / (factors * base_freq)
    return 1.0 / base_freq


def rope_attention_factor(rope: RopeConfig) -> float:
    """What cos and sin are multiplied by (yarn and longrope; 1 for the others)."""
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.rope_type == "yarn":
        if rope.mscale and rope.mscale_all_dim:
            return _mscale(rope.factor, rope.mscale) / _mscale(rope.factor, rope.mscale_all_dim)
        return _mscale(rope.factor)
    if rope.rope_type == "longrope" and rope.factor > 1.0:
        original = rope.original_max_position_embeddings
        return math.sqrt(1 + math.log(rope.factor) / math.log(original))
    return 1.0


def _mscale(factor: float, weight: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0


def _yarn_inv_freq(base_freq: torch.Tensor, rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Interpolate low frequencies by `factor`, keep high ones, with a linear ramp between the
    dims that turn `beta_fast` and `beta_slow` times over the original context."""

    def correction_dim(num_rotations: float) -> float:
        turns = rope.original_max_position_embeddings / (num_rotations * 2 * math.pi)
        return head_dim * math.log(turns) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = (
        (torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)
    ).clamp(0, 1)
    keep = 1 - ramp
    return (1.0 / (rope.factor * base_freq)) * (1 - keep) + (1.0 / base_freq) * keep


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
    """[max_positions, head_dim]: cos of each angle in the first half, sin in the second.

    Dynamic and longrope rotate position p with the frequencies of a sequence p + 1 tokens long:
    what transformers computes for a sequence decoding token by token. (transformers rotates a
    whole prompt with its full length's frequencies, so the two agree exactly while prompts stay
    within the original context.)"""
    positions = torch.arange(max_positions, dtype=torch.float32, device="cpu")
    inv_freq = rope_inv_freq(rope, head_dim)[None, :].expand(max_positions, -1)
    if rope.rope_type in ("dynamic", "longrope"):
        inv_freq = inv_freq.clone()
        for p in range(rope.original_max_position_embeddings, max_positions):
            inv_freq[p] = rope_inv_freq(rope, head_dim, seq_len=p + 1)
    angles = positions[:, None] * inv_freq
    scale = rope_attention_factor(rope)
    return torch.cat((angles.cos() * scale, angles.sin() * scale), dim=-1).to(device)


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
