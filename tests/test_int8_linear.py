"""Weight-only int8 linear layers (baton.kernels.int8_linear): the quantizer's codes and scales, and
both paths, `int8_linear` (the C++ kernel for float32 where it built) and the plain-torch
`int8_linear_torch`, against the dequantized float matmul they stand for. The kernel's own
cases: tests/test_int8_linear_cpu.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from baton.kernels.int8_linear import (
    INT8_MATMUL_MAX_ROWS,
    dequantize,
    int8_linear,
    int8_linear_ref,
    int8_linear_torch,
    quantize_per_channel,
)


def test_each_row_is_scaled_so_its_largest_weight_is_127() -> None:
    weight = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [2.0, 1.0, -0.01]])

    codes, scales = quantize_per_channel(weight)

    assert codes.dtype == torch.int8 and scales.dtype == torch.float32
    torch.testing.assert_close(scales, torch.tensor([1.0, 0.0, 2.0]) / 127)
    assert codes.tolist() == [[64, -127, 32], [0, 0, 0], [127, 64, -1]]


def test_dequantized_weight_is_within_half_a_step_of_the_float_weight() -> None:
    weight = torch.randn(48, 200, generator=torch.Generator().manual_seed(0))

    codes, scales = quantize_per_channel(weight)

    error = (dequantize(codes, scales) - weight).abs()
    assert bool((error <= scales[:, None] / 2 + 1e-7).all())


PATHS = [int8_linear, int8_linear_torch]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 64, 300])
@pytest.mark.parametrize(("k", "n"), [(64, 96), (512, 1024), (1408, 512), (200, 33)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_linear_matches_the_dequantized_float_matmul(
    path, rows: int, k: int, n: int, with_bias: bool
) -> None:
    generator = torch.Generator().manual_seed(rows * k + n)
    codes, scales = quantize_per_channel(torch.randn(n, k, generator=generator) * 0.02)
    bias = torch.randn(n, generator=generator) if with_bias else None
    x = torch.randn(rows, k, generator=generator)

    out = path(x, codes, scales, bias)

    assert out.shape == (rows, n) and out.dtype == torch.float32
    expected = int8_linear_ref(x, codes, scales, bias)
    # The C++ kernel rounds activations to int16 at each row's |x|max / 32767: up to half a step
    # each, times the weights' magnitudes (tests/test_int8_linear_cpu.py holds it to that bound).
    rounding = x.abs().amax(dim=1, keepdim=True) / 65534 * dequantize(codes, scales).abs().sum(1)
    error = (out - expected).abs()
    assert bool((error <= rounding + 1e-4 + 1e-4 * expected.abs()).all())


@pytest.mark.parametrize("rows", [2, 7])
def test_int8_linear_runs_bfloat16_activations_with_bfloat16_scales(rows: int) -> None:
    generator = torch.Generator().manual_seed(1)
    codes, scales = quantize_per_channel(torch.randn(64, 128, generator=generator).bfloat16())
    x = torch.randn(rows, 128, generator=generator).bfloat16()

    out = int8_linear(x, codes, scales, None)

    assert scales.dtype == out.dtype == torch.bfloat16
    # Outputs of magnitude ~10 in bfloat16 (8 bits of mantissa): steps of ~0.06.
    torch.testing.assert_close(out, int8_linear_ref(x, codes, scales, None), rtol=2e-2, atol=0.1)


@pytest.mark.parametrize("path", PATHS)
def test_int8_linear_is_close_to_the_float_weights_it_was_made_from(path) -> None:
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(256, 512, generator=generator) * 0.02
    x = torch.randn(16, 512, generator=generator)
    expected = F.linear(x, weight)

    out = path(x, *quantize_per_channel(weight), None)

    # Rounding errors of up to half a step per weight, independent, add up to ~1% of the output.
    relative = (out - expected).norm() / expected.norm()
    assert relative < 0.01, relative


def test_up_to_the_int8_matmuls_rows_a_rows_result_does_not_depend_on_its_neighbours() -> None:
    # The plain-torch path; the C++ kernel's rows are batch-invariant at any count
    # (tests/test_int8_linear_cpu.py).
    generator = torch.Generator().manual_seed(3)
    codes, scales = quantize_per_channel(torch.randn(704, 128, generator=generator))
    x = torch.randn(INT8_MATMUL_MAX_ROWS, 128, generator=generator)
    alone = torch.cat([int8_linear_torch(x[i : i + 1], codes, scales, None) for i in range(len(x))])

    for rows in range(2, INT8_MATMUL_MAX_ROWS + 1):
        assert torch.equal(int8_linear_torch(x[:rows], codes, scales, None), alone[:rows]), rows
