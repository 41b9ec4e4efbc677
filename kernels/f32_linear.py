"""Float32 linear layers on the CPU through Baton's C++ kernel (kernels/csrc/f32_linear_cpu.cpp),
over weights packed once at load into its own layout, `pack_weight`'s.

At a decode step's few rows the weights' read is the step, and the kernel reads each tile's
weights as one sequential stream. Its rows are batch-invariant at every row count, so it serves
prefill too: a switch to oneDNN by row count would give a row different bits alone and batched.

A gated MLP's gate and up projections pack together (`pack_gated_weight`): each panel holds 8
gate channels beside the same 8 up channels, and `f32_gated_linear` returns act(gate) * up with
the gate applied in the kernel, so the [gate | up] outputs are never written out and read back.

The float linears take the kernel only where it was built with vector code (`f32_kernel_available`).
"""

from __future__ import annotations

import logging
import os
from functools import cache

import torch

from baton.kernels.cpu_extension import MARCH_ENV, cpu_kernels_available

logger = logging.getLogger(__name__)

# The kernel's layout: panels of PACK_CHANNELS output channels, each storing its channels'
# weights k by k (kernels/csrc/f32_linear_cpu.cpp says why).
PACK_CHANNELS = 16


@cache
def f32_kernel_available() -> bool:
    """Whether the CPU's float32 linears run in this kernel: the C++ kernels built, with AVX2 and
    FMA or AVX-512. A build without them (for a CPU or a `BATON_CPU_MARCH` below x86-64-v3) has
    only the portable tiles, whose fused multiply-adds are then a library call a lane, so the
    float linears run in oneDNN (baton.kernels.linear), which picks its own vector code at run time;
    said once."""
    if not cpu_kernels_available():
        return False
    if torch.ops.baton_cpu.f32_linear_isa() != "portable":
        return True
    logger.info(
        "Baton's C++ CPU kernels were built for -march=%s, without AVX2 and FMA, so float32 "
        "linear layers run in oneDNN (on a CPU with AVX2, set %s=x86-64-v3 or leave it unset "
        "for Baton's own float32 kernel)",
        os.environ.get(MARCH_ENV) or "native",
        MARCH_ENV,
    )
    return False


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """The kernel's layout of a float32 `weight` [out, in]: [ceil(out / 16), in, 16], the
    padding channels zeros."""
    n, k = weight.shape
    groups = -(-n // PACK_CHANNELS)
    padded = weight.new_zeros(groups * PACK_CHANNELS, k)
    padded[:n] = weight.detach()
    return padded.view(groups, PACK_CHANNELS, k).transpose(1, 2).contiguous()


def pack_gated_weight(weight: torch.Tensor) -> torch.Tensor:
    """`f32_gated_linear`'s layout of a gated MLP's float32 [gate | up] weight [2 * I, in]:
    [ceil(I / 8), in, 16], each panel 8 gate channels then the same 8 up channels, the
    padding channels zeros."""
    n, k = weight.shape
    if n % 2:
        raise ValueError(f"a [gate | up] weight has an even number of rows, not {n}")
    half = PACK_CHANNELS // 2
    intermediate = n // 2
    groups = -(-intermediate // half)
    halves = weight.new_zeros(2, groups * half, k)
    halves[:, :intermediate] = weight.detach().view(2, intermediate, k)
    # [gate | up] halves -> per group its 8 gate rows, then its 8 up rows.
    interleaved = halves.view(2, groups, half, k).transpose(0, 1).reshape(groups * PACK_CHANNELS, k)
    return pack_weight(interleaved)


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


def f32_gated_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, intermediate_size: int, gelu: bool
) -> torch.Tensor:
    """act(gate) * up of `F.linear(x, weight)` = [gate | up], act SiLU (or GeLU-tanh with
    `gelu`), for float32 `x` [rows, in] on the CPU over `pack_gated_weight(weight)`: the same
    floats as `silu_and_mul` (`gelu_tanh_and_mul`) of `f32_linear`'s [gate | up]."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return torch.ops.baton_cpu.f32_gated_linear(x, packed_weight, intermediate_size, gelu)
