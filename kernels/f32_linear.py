"""Float32 linear layers on the CPU through Baton's C++ kernel (kernels/csrc/f32_linear_cpu.cpp),
over weights packed once at load into its own layout, `pack_weight`'s.

At a decode step's few rows the weights' read is the step, and the kernel reads each tile's
weights as one sequential stream. Its rows are batch-invariant at every row count, so it serves
prefill too: a switch to oneDNN by row count would give a row different bits alone and batched.
"""

from __future__ import annotations

import torch

# The kernel's layout: panels of PACK_CHANNELS output channels, each storing its channels'
# weights k by k (kernels/csrc/f32_linear_cpu.cpp says why).
PACK_CHANNELS = 16


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """The kernel's layout of a float32 `weight` [out, in]: [ceil(out / 16), in, 16], the
    padding channels zeros."""
    n, k = weight.shape
    groups = -(-n // PACK_CHANNELS)
    padded = weight.new_zeros(groups * PACK_CHANNELS, k)
    padded[:n] = weight.detach()
    return padded.view(groups, PACK_CHANNELS, k).transpose(1, 2).contiguous()


def unpack_weight(packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """`pack_weight`'s inverse: the weight [out, in] again."""
    groups, k, channels = packed.shape
    return packed.transpose(1, 2).reshape(groups * channels, k)[:out_features]


def f32_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for float32 `x` [rows, in] on the CPU, over
    `pack_weight(weight)`. Rows may have a stride; non-contiguous columns are copied first."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return torch.ops.baton_cpu.f32_linear(x, packed_weight, bias, out_features)
