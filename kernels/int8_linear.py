"""Weight-only int8 linear layers on the CPU: symmetric int8 weights with one scale per output
channel, activations in float.

Float32 activations run through Baton's C++ kernel (kernels/csrc/int8_linear_cpu.cpp), which
rounds each activation row to int16 at the row's own scale and sums integer products, sharing
each widened weight across the rows of a tile, at any row count; it differs from
`int8_linear_ref` by that rounding alone (at most |x|max / 65534 * sum |w| per output), and its
rows are batch-invariant. It reads the codes in its own layout, `pack_codes`'s, made once
at load. Where the extension did not build, or the activations are bfloat16 or float16,
`int8_linear_torch` runs over the codes as [out, in] rows: torch's own int8 weight matmul
(`aten._weight_int8pack_mm`, one pass over the weights per row) for a few rows, a float copy
of the weight and `F.linear` for more. `quantize_per_channel` makes the weights once at load;
`int8_linear_ref` is the definition both are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from baton.kernels.cpu_extension import cpu_kernels_available

# Symmetric: -127..127, so negating a weight negates its code (-128 would have no mirror).
INT8_MAX = 127
# Without the C++ kernel: up to this many rows torch's int8 matmul's pass per row costs less
# than a float copy of the weight (docs/decisions.md).
INT8_MATMUL_MAX_ROWS = 16
# torch 2.13's int8 matmul for half-precision rows on an AVX512-BF16 CPU (an Intel Xeon)
# returns NaN and infinities, and may crash, where the rows' length is not a multiple of 16;
# float32 rows and lengths of multiples of 16 come out right.
INT8_MATMUL_HALF_MULTIPLE = 16
# The kernel's layout: groups of PACK_CHANNELS output channels, each storing PACK_LANES weights
# of a k block side by side (kernels/csrc/int8_linear_cpu.cpp says why).
PACK_CHANNELS = 12
PACK_LANES = 8


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [out, in], scales [out] in `weight`'s dtype) of `weight` [out, in]: each
    output row scaled so its largest magnitude maps to 127, rounded to the nearest code."""
    rows = weight.detach().float()
    scales = (rows.abs().amax(dim=1) / INT8_MAX).to(weight.dtype)
    # Rounded with the scale as stored, so codes and scales agree; an all-zero row (or one
    # whose scale underflows the dtype) divides by one and gets zero codes.
    divisor = torch.where(scales == 0, 1.0, scales.float())
    codes = torch.round(rows / divisor[:, None]).clamp(-INT8_MAX, INT8_MAX)
    return codes.to(torch.int8), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float weight [out, in] that int8 `codes` and per-row `scales` stand for."""
    return codes * scales[:, None]


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """The kernel's layout of int8 `codes` [..., out, in]: [..., ceil(out / 12), ceil(in / 8),
    12, 8], zero-padded; leading dims (stacked experts) are kept."""
    *lead, n, k = codes.shape
    groups, blocks = -(-n // PACK_CHANNELS), -(-k // PACK_LANES)
    padded = codes.new_zeros(*lead, groups * PACK_CHANNELS, blocks * PACK_LANES)
    padded[..., :n, :k] = codes
    tiles = padded.view(*lead, groups, PACK_CHANNELS, blocks, PACK_LANES)
    return tiles.transpose(-3, -2).contiguous()


def unpack_codes(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """`pack_codes`'s inverse: the codes [..., out, in] again."""
    *lead, groups, blocks, channels, lanes = packed.shape
    rows = packed.transpose(-3, -2).reshape(*lead, groups * channels, blocks * lanes)
    return rows[..., :out_features, :in_features]


def is_packed(codes: torch.Tensor) -> bool:
    """Whether 2-d-per-matrix `codes` are in the kernel's layout (the last two dims 12 x 8)."""
    return codes.dim() >= 4 and codes.shape[-2:] == (PACK_CHANNELS, PACK_LANES)


def kernel_layout(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The codes as they are best kept for activations of `dtype`: packed where the C++ kernel
    will take them (float32, the extension built), as [..., out, in] rows otherwise."""
    if dtype == torch.float32 and codes.device.type == "cpu" and cpu_kernels_available():
        return pack_codes(codes)
    return codes


def int8_linear(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`F.linear(x, dequantize(codes, scales), bias)` for 2-d `x` in the scales' dtype; `codes`
    as [out, in] rows or packed (`pack_codes`)."""
    if not is_packed(codes):
        return int8_linear_torch(x, codes, scales, bias)
    if uses_int8_kernel(x, scales, bias):
        return torch.ops.baton_cpu.int8_linear(x, codes, scales, bias)
    return int8_linear_torch(x, unpack_codes(codes, scales.shape[0], x.shape[1]), scales, bias)


def uses_int8_kernel(x: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the C++ kernel takes this call over packed codes: float32 rows, scales (and
    bias) as it reads them."""
    return (
        x.device.type == "cpu"
        and x.dtype == scales.dtype == torch.float32
        and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
        and x.dim() == 2
        and x.stride(-1) == 1
        and scales.is_contiguous()
        and cpu_kernels_available()
    )


def int8_linear_torch(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`int8_linear` in plain torch, for any float dtype torch's int8 matmul takes."""
    unsafe_length = x.dtype != torch.float32 and x.shape[-1] % INT8_MATMUL_HALF_MULTIPLE
    if x.shape[0] > INT8_MATMUL_MAX_ROWS or unsafe_length:
        return F.linear(x, dequantize(codes, scales), bias)
    out = torch.ops.aten._weight_int8pack_mm(x.contiguous(), codes, scales)
    if bias is not None:
        out += bias
    return out


def int8_linear_ref(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`int8_linear` by its definition, in float32 (the weight dequantized first)."""
    weight = dequantize(codes, scales.float())
    return F.linear(x.float(), weight, None if bias is None else bias.float()).to(x.dtype)
