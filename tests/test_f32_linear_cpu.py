"""The C++ float32 linear (kernels/csrc/f32_linear_cpu.cpp) against `F.linear`: shapes whose
sizes are not multiples of the vector width or of the kernel's tiles, bias or none, strided rows;
and a row's bits do not depend on the rows beside it, at any row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.f32_linear import f32_linear, pack_weight, unpack_weight


@pytest.fixture(autouse=True)
def kernels_built():
    # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
    assert cpu_kernels_available()


def problem(rows: int, k: int, n: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=generator) * k**-0.5
    x = torch.randn(rows, k, generator=generator)
    return x, weight, torch.randn(n, generator=generator)


def kernel(x, weight, bias):
    return f32_linear(x, pack_weight(weight), bias, weight.shape[0])


# Rows: one, each partial row tile, whole tiles with a remainder, prefill chunks. In: odd widths
# and the models'. Out: one channel, part of a panel, a panel and a part, the models' widths.
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 13, 64, 257])
@pytest.mark.parametrize(("k", "n"), [(5, 1), (13, 7), (200, 33), (512, 1024), (1408, 16)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_matches_f_linear(rows, k, n, with_bias):
    x, weight, bias = problem(rows, k, n, seed=rows * k + n)
    bias = bias if with_bias else None

    out = kernel(x, weight, bias)

    assert out.shape == (rows, n) and out.dtype == torch.float32
    # One sum in k order against MKL's blocked order: float32 rounding apart.
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=2e-5)


def test_kernel_matches_f_linear_at_the_widest_model_shape():
    x, weight, bias = problem(3, 4864, 896)

    torch.testing.assert_close(kernel(x, weight, bias), F.linear(x, weight, bias))


def test_kernel_reads_rows_with_a_stride():
    wide, weight, bias = problem(6, 300, 40)
    x = wide[:, 37:237]  # contiguous rows, row stride 300
    weight = weight[:, :200].contiguous()

    out = kernel(x, weight, bias)

    assert torch.equal(out, kernel(x.contiguous(), weight, bias))
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=2e-5)


def test_columns_with_a_stride_are_copied_first():
    x, weight, bias = problem(5, 24, 16)
    columns_strided = x.t().contiguous().t()

    assert torch.equal(kernel(columns_strided, weight, bias), kernel(x, weight, bias))


def test_zero_rows_give_an_empty_result():
    x, weight, bias = problem(0, 24, 16)

    assert kernel(x, weight, bias).shape == (0, 16)


@pytest.mark.parametrize(("k", "n"), [(13, 29), (512, 1024), (1408, 512), (4864, 40)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_rows_result_does_not_depend_on_the_batch_it_runs_in(k, n, with_bias):
    x, weight, bias = problem(70, k, n, seed=k)
    bias = bias if with_bias else None
    packed = pack_weight(weight)
    alone = torch.cat([f32_linear(x[i : i + 1], packed, bias, n) for i in range(len(x))])

    # Every row-tile remainder, several row tiles, and more rows than a parallel task's share;
    # at in = 4864, 70 rows are two prefill row blocks (kernels/csrc/linear_kernels.h).
    for rows in [2, 3, 4, 5, 6, 7, 8, 11, 17, 33, 70]:
        assert torch.equal(f32_linear(x[:rows], packed, bias, n), alone[:rows]), rows
    # A row's place in the batch does not matter either.
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    assert torch.equal(f32_linear(x[order], packed, bias, n), alone[order])


@pytest.mark.parametrize("rows", [1, 9, 40])  # one row tile, the decode path's chunks, prefill
def test_a_layer_with_no_inputs_gives_its_bias(rows):
    weight, bias = torch.zeros(20, 0), torch.arange(20.0)

    assert torch.equal(kernel(torch.zeros(rows, 0), weight, bias), bias.expand(rows, 20))


# More threads than this machine's two cores: each thread's run of shares is cut where it
# loses its core, and the others take the rest of it from the back.
@pytest.mark.parametrize("rows", [1, 9, 300])
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_a_rows_result_does_not_depend_on_the_thread_count(rows, threads):
    x, weight, bias = problem(rows, 512, 1024)
    packed = pack_weight(weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = f32_linear(x, packed, bias, 1024)
        torch.set_num_threads(threads)
        many = [f32_linear(x, packed, bias, 1024) for _ in range(5)]
    finally:
        torch.set_num_threads(before)

    assert all(torch.equal(one, out) for out in many)


@pytest.mark.parametrize(("k", "n"), [(1, 1), (13, 29), (16, 32), (1408, 512)])
def test_packing_keeps_every_weight_and_pads_with_zeros(k, n):
    weight = torch.randn(n, k)

    packed = pack_weight(weight)

    assert packed.shape == (-(-n // 16), k, 16)
    assert torch.equal(unpack_weight(packed, n), weight)
    assert not unpack_weight(packed, packed.shape[0] * 16)[n:].any()


def test_kernel_refuses_a_weight_in_rows_rather_than_packed():
    x, weight, _ = problem(2, 16, 4)

    with pytest.raises(RuntimeError, match="the weight is packed"):
        torch.ops.baton_cpu.f32_linear(x, weight, None, 4)


def test_kernel_refuses_a_width_that_does_not_match_the_weight():
    x, weight, _ = problem(2, 16, 4)

    with pytest.raises(RuntimeError, match="in = x's columns"):
        kernel(x[:, :7], weight, None)


def test_kernel_refuses_bfloat16_rows_with_a_message():
    x, weight, _ = problem(2, 16, 4)

    with pytest.raises(RuntimeError, match="x is float32"):
        kernel(x.bfloat16(), weight, None)
