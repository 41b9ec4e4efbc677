"""The C++ weight-only int8 linear (kernels/csrc/int8_linear_cpu.cpp) against its reference,
`int8_linear_ref`, within the error its int16 activations allow, and bit for bit against a
model of its arithmetic: shapes whose sizes are not multiples of the vector width or of the
kernel's tiles, bias or none, strided rows; and a row's bits do not depend on the rows beside
it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.int8_linear import (
    int8_linear,
    int8_linear_ref,
    pack_codes,
    quantize_per_channel,
    unpack_codes,
)


@pytest.fixture(autouse=True)
def kernels_built():
    # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
    assert cpu_kernels_available()


def problem(rows: int, k: int, n: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    codes, scales = quantize_per_channel(torch.randn(n, k, generator=generator) * 0.05)
    x = torch.randn(rows, k, generator=generator)
    return x, codes, scales, torch.randn(n, generator=generator)


def kernel(x, codes, scales, bias):
    return torch.ops.baton_cpu.int8_linear(x, pack_codes(codes), scales, bias)


def assert_within_activation_rounding(out, x, codes, scales, bias):
    """The kernel rounds each activation to int16 at its row's scale, |x|max / 32767: an error
    of at most half a step per activation, so at most |x|max / 65534 * sum_k |w[n, k]| per
    output, plus float32 rounding of the sums (the reference's own included)."""
    weight = codes.float() * scales[:, None]
    rounding = x.abs().amax(dim=1, keepdim=True) / 65534 * weight.abs().sum(dim=1)
    float_sums = 1e-6 * (x.abs() @ weight.abs().T) + 1e-6
    if bias is not None:
        float_sums = float_sums + 1e-6 * bias.abs()
    error = (out - int8_linear_ref(x, codes, scales, bias)).abs()
    assert bool((error <= rounding + float_sums).all()), (error / (rounding + float_sums)).max()


def kernel_model(x, codes, scales):
    """The kernel's arithmetic in torch, step for step: each row to int16 at |x|max / 32767
    (half to even), exact integer sums per lane (lane j of a channel takes k = 2j, 2j + 1 of
    every block of 8) over chunks of 256 blocks, each chunk's lanes added in float32, then the
    lanes summed as (l0 + l1) + (l2 + l3) and scaled by the row's scale, then the channel's."""
    top = x.abs().amax(dim=1, keepdim=True)
    # A tensor over a tensor: `32767 / top` is torch's reciprocal of top times 32767, two
    # roundings, which moves some rows' step by an ulp and so some of their values by one.
    q = torch.round(x * (torch.tensor(32767.0) / top)).to(torch.int64)
    k = x.shape[1]
    blocks = -(-k // 8)
    q = F.pad(q, (0, blocks * 8 - k)).view(len(x), blocks, 4, 2)
    w = F.pad(codes.to(torch.int64), (0, blocks * 8 - k)).view(len(codes), blocks, 4, 2)
    lanes = torch.zeros(len(x), len(codes), 4)
    for b0 in range(0, blocks, 256):
        chunk = torch.einsum("mbjp,nbjp->mnj", q[:, b0 : b0 + 256], w[:, b0 : b0 + 256])
        lanes = lanes + chunk.float()
    dots = (lanes[..., 0] + lanes[..., 1]) + (lanes[..., 2] + lanes[..., 3])
    return dots * (top / 32767) * scales


# Rows: one, each partial row tile, whole tiles with a remainder, a prefill chunk. In: under
# one vector, a vector and a tail, the models' widths. Out: one channel, partial channel tiles,
# a whole group, the models' widths.
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 64, 257])
@pytest.mark.parametrize(("k", "n"), [(5, 1), (13, 7), (200, 33), (512, 1024), (1408, 12)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_matches_the_dequantized_float32_matmul(rows, k, n, with_bias):
    x, codes, scales, bias = problem(rows, k, n, seed=rows * k + n)
    bias = bias if with_bias else None

    out = kernel(x, codes, scales, bias)

    assert out.shape == (rows, n) and out.dtype == torch.float32
    assert_within_activation_rounding(out, x, codes, scales, bias)


# One chunk of int32 sums, and (in 16,800) several, the last partial; with 9 rows the row tiles
# pass over the weights in chunks of k blocks, carrying their sums across the flushes.
@pytest.mark.parametrize(
    ("rows", "k", "n"), [(1, 13, 7), (5, 512, 40), (3, 1408, 12), (2, 16800, 5), (9, 16800, 5)]
)
def test_kernel_computes_exactly_what_its_model_does(rows, k, n):
    x, codes, scales, _ = problem(rows, k, n, seed=k)

    assert torch.equal(kernel(x, codes, scales, None), kernel_model(x, codes, scales))


def test_the_error_bound_catches_a_single_wrong_code():
    # The bound is tight enough to tell one code off by one in 512 from the activation rounding.
    x, codes, scales, _ = problem(1, 512, 1, seed=5)
    out = kernel(x, codes, scales, None)
    k = int(x.abs().argmax())
    wrong = codes.clone()
    wrong[0, k] += 1 if wrong[0, k] < 127 else -1

    with pytest.raises(AssertionError):
        assert_within_activation_rounding(out, x, wrong, scales, None)


def test_the_largest_activation_is_exact_and_outliers_keep_the_rest_close():
    # A row whose largest value is 1000x its others: these keep ~15 bits less, still well
    # within the bound; the scale is the row's own, so the row beside it is unaffected.
    x, codes, scales, bias = problem(2, 512, 24)
    x[0, 3] = 1000.0

    out = kernel(x, codes, scales, bias)

    assert_within_activation_rounding(out, x, codes, scales, bias)
    assert torch.equal(out[1:], kernel(x[1:], codes, scales, bias))


def test_a_row_with_a_nan_or_an_infinity_gives_nan_and_leaves_the_others_alone():
    x, codes, scales, bias = problem(3, 64, 8)
    x[0, 5], x[2, 60] = float("nan"), float("inf")

    out = kernel(x, codes, scales, bias)

    assert bool(out[0].isnan().all()) and bool(out[2].isnan().all())
    assert torch.equal(out[1:2], kernel(x[1:2], codes, scales, bias))


def test_an_all_zero_row_gives_the_bias():
    x, codes, scales, bias = problem(2, 64, 8)
    x[1] = 0.0

    assert torch.equal(kernel(x, codes, scales, bias)[1], bias)


def test_kernel_reads_rows_with_a_stride():
    wide, codes, scales, bias = problem(6, 300, 40)
    x = wide[:, 37:237]  # contiguous rows, row stride 300
    codes = codes[:, :200].contiguous()

    out = kernel(x, codes, scales, bias)

    assert torch.equal(out, kernel(x.contiguous(), codes, scales, bias))
    assert_within_activation_rounding(out, x, codes, scales, bias)


def test_an_all_zero_weight_row_gives_the_bias():
    x, codes, scales, bias = problem(3, 64, 8)
    codes[5], scales[5] = 0, 0.0

    out = kernel(x, codes, scales, bias)

    assert torch.equal(out[:, 5], bias[5].expand(3))


# In 4,864: 608 k blocks, so the row tiles of 7 to 32 rows, which pass over the weights a chunk
# of k blocks at a time, carry unflushed int32 sums across chunks and flush twice on the way.
@pytest.mark.parametrize(("k", "n"), [(13, 29), (512, 1024), (1408, 512), (4864, 40)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_rows_result_does_not_depend_on_the_batch_it_runs_in(k, n, with_bias):
    x, codes, scales, bias = problem(70, k, n, seed=k)
    bias = bias if with_bias else None
    alone = torch.cat([kernel(x[i : i + 1], codes, scales, bias) for i in range(len(x))])

    # Every row-tile remainder, several row tiles, and more rows than a parallel task's share;
    # at in = 4864, 70 rows are two prefill row blocks (kernels/csrc/linear_kernels.h).
    for rows in [2, 3, 4, 5, 6, 7, 8, 17, 33, 70]:
        assert torch.equal(kernel(x[:rows], codes, scales, bias), alone[:rows]), rows
    # A row's place in the batch does not matter either.
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    assert torch.equal(kernel(x[order], codes, scales, bias), alone[order])


def test_int8_linear_runs_the_kernel_for_float32_rows_over_packed_codes():
    x, codes, scales, bias = problem(40, 96, 80)

    out = int8_linear(x, pack_codes(codes), scales, bias)

    assert torch.equal(out, kernel(x, codes, scales, bias))


@pytest.mark.parametrize("k", [40, 48])
def test_half_precision_rows_of_any_length_come_out_near_the_reference(k):
    # torch's int8 matmul gave NaN for bfloat16 rows of 40 on an AVX512-BF16 CPU.
    x, codes, scales, bias = problem(3, k, 30)
    x, scales, bias = x.bfloat16(), scales.bfloat16(), bias.bfloat16()

    out = int8_linear(x, codes, scales, bias).float()

    expected = int8_linear_ref(x, codes, scales, bias).float()
    assert torch.allclose(out, expected, atol=0.05, rtol=0.02)


def test_int8_linear_takes_packed_codes_where_the_kernel_cannot_run():
    # bfloat16 activations: torch's path, over the codes unpacked again.
    x, codes, scales, _ = problem(3, 40, 30)
    x, scales = x.bfloat16(), scales.bfloat16()

    out = int8_linear(x, pack_codes(codes), scales, None)

    assert torch.equal(out, int8_linear(x, codes, scales, None))


@pytest.mark.parametrize(("k", "n"), [(1, 1), (13, 29), (16, 24), (1408, 512)])
def test_packing_keeps_every_code_and_pads_with_zeros(k, n):
    codes = torch.randint(-127, 128, (2, n, k), dtype=torch.int8)  # two stacked experts

    packed = pack_codes(codes)

    assert packed.shape == (2, -(-n // 12), -(-k // 8), 12, 8)
    assert torch.equal(unpack_codes(packed, n, k), codes)
    assert int(packed.abs().sum()) == int(codes.abs().sum())  # the padding is zeros
    assert torch.equal(pack_codes(codes[1]), packed[1])


def test_kernel_refuses_float_codes_with_a_message():
    x, codes, scales, _ = problem(2, 16, 4)

    with pytest.raises(RuntimeError, match="codes are contiguous int8"):
        torch.ops.baton_cpu.int8_linear(x, pack_codes(codes).float(), scales, None)


def test_kernel_refuses_codes_in_rows_rather_than_packed():
    x, codes, scales, _ = problem(2, 16, 4)

    with pytest.raises(RuntimeError, match="codes are packed"):
        torch.ops.baton_cpu.int8_linear(x, codes, scales, None)


def test_kernel_refuses_a_width_that_does_not_match_the_codes():
    x, codes, scales, _ = problem(2, 16, 4)

    with pytest.raises(RuntimeError, match="in = x's columns"):
        kernel(x[:, :7], codes, scales, None)


# More threads than this machine's two cores: each thread's run of shares is cut where it loses
# its core, and the others take the rest of it from the back.
@pytest.mark.parametrize("rows", [1, 9, 300])
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_a_rows_result_does_not_depend_on_the_thread_count(rows, threads):
    x, codes, scales, bias = problem(rows, 512, 1024)
    packed = pack_codes(codes)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.baton_cpu.int8_linear(x, packed, scales, bias)
        torch.set_num_threads(threads)
        many = [torch.ops.baton_cpu.int8_linear(x, packed, scales, bias) for _ in range(5)]
    finally:
        torch.set_num_threads(before)

    assert all(torch.equal(one, out) for out in many)
