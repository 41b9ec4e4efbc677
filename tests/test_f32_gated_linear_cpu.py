"""The C++ float32 linear with the MLP's gate applied in the kernel (`f32_gated_linear` over
`pack_gated_weight`'s layout) against the unfused path, F.linear and then act(gate) * up:
intermediate sizes that are not multiples of a panel's 8 outputs, decode and prefill row counts,
both gates; a row's bits do not depend on its batch; and the model's MLP takes this path where
Baton's float32 kernel runs its gate_up projection."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from baton.gpu.models.model import MLP
from baton.kernels.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.f32_linear import (
    PACK_CHANNELS,
    f32_gated_linear,
    f32_kernel_available,
    f32_linear,
    pack_gated_weight,
    pack_weight,
    unpack_weight,
)


@pytest.fixture(autouse=True)
def kernels_built():
    # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
    assert cpu_kernels_available()


def problem(rows: int, k: int, intermediate: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(2 * intermediate, k, generator=generator) * 3 * k**-0.5
    return torch.randn(rows, k, generator=generator), weight


def unfused(x, weight, gelu):
    gate_up = F.linear(x.double(), weight.double())
    return (gelu_tanh_and_mul_ref if gelu else silu_and_mul_ref)(gate_up).float()


# Rows: one, partial and whole row tiles, a decode step's most, prefill. Intermediate: one
# output, part of a panel, a panel and a part, the bench Llama's.
@pytest.mark.parametrize("rows", [1, 2, 5, 7, 13, 32, 33, 257])
@pytest.mark.parametrize(("k", "intermediate"), [(5, 1), (13, 7), (200, 21), (512, 1408)])
@pytest.mark.parametrize("gelu", [False, True])
def test_gated_kernel_matches_the_linear_then_the_gate(rows, k, intermediate, gelu):
    x, weight = problem(rows, k, intermediate, seed=rows * k + intermediate)

    out = f32_gated_linear(x, pack_gated_weight(weight), intermediate, gelu)

    assert out.shape == (rows, intermediate) and out.dtype == torch.float32
    torch.testing.assert_close(out, unfused(x, weight, gelu), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("rows", [1, 8, 40])
@pytest.mark.parametrize("gelu", [False, True])
def test_gated_kernel_gives_the_unfused_kernels_floats(rows, gelu):
    # The same sums as Baton's own linear, gated by the same compiled code (gates.h).
    x, weight = problem(rows, 896, 300)
    gate_up = f32_linear(x, pack_weight(weight), None, 600)
    gate_op = torch.ops.baton_cpu.gelu_tanh_and_mul if gelu else torch.ops.baton_cpu.silu_and_mul

    out = f32_gated_linear(x, pack_gated_weight(weight), 300, gelu)

    assert torch.equal(out, gate_op(gate_up))


@pytest.mark.parametrize("rows", [7, 33, 300])
def test_a_rows_gated_result_does_not_depend_on_its_batch(rows):
    x, weight = problem(rows, 512, 1408)
    packed = pack_gated_weight(weight)

    batched = f32_gated_linear(x, packed, 1408, False)

    for r in (0, rows // 2, rows - 1):
        assert torch.equal(f32_gated_linear(x[r : r + 1], packed, 1408, False)[0], batched[r])


@pytest.mark.parametrize("rows", [9, 300])
@pytest.mark.parametrize("threads", [2, 5])
def test_a_rows_gated_result_does_not_depend_on_the_thread_count(rows, threads):
    x, weight = problem(rows, 512, 1408)
    packed = pack_gated_weight(weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = f32_gated_linear(x, packed, 1408, False)
        torch.set_num_threads(threads)
        many = f32_gated_linear(x, packed, 1408, False)
    finally:
        torch.set_num_threads(before)

    assert torch.equal(one, many)


@pytest.mark.parametrize(("k", "intermediate"), [(1, 1), (13, 8), (16, 21)])
def test_gated_packing_puts_each_panels_gates_beside_their_ups(k, intermediate):
    weight = torch.randn(2 * intermediate, k)
    gate, up = weight[:intermediate], weight[intermediate:]

    packed = pack_gated_weight(weight)

    half = PACK_CHANNELS // 2
    groups = -(-intermediate // half)
    assert packed.shape == (groups, k, PACK_CHANNELS)
    panels = unpack_weight(packed, groups * PACK_CHANNELS).view(groups, 2, half, k)
    gates, ups = panels[:, 0].reshape(-1, k), panels[:, 1].reshape(-1, k)
    assert torch.equal(gates[:intermediate], gate) and torch.equal(ups[:intermediate], up)
    assert not gates[intermediate:].any() and not ups[intermediate:].any()


def test_gated_packing_refuses_an_odd_number_of_rows():
    with pytest.raises(ValueError, match="even number of rows"):
        pack_gated_weight(torch.randn(5, 4))


def test_gated_kernel_refuses_the_plain_layout_of_another_width():
    x, weight = problem(2, 16, 24)

    with pytest.raises(RuntimeError, match="pack_gated_weight"):
        f32_gated_linear(x, pack_weight(weight), 40, False)


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
def test_a_packed_float32_mlp_gates_in_the_kernel(act):
    if not f32_kernel_available():
        pytest.skip("this build's float32 linears run in oneDNN: the kernel has no vector code")
    # The MLP reads these three fields of a model's config.
    config = SimpleNamespace(hidden_size=64, intermediate_size=100, hidden_act=act)
    mlp = MLP(config)
    with torch.no_grad():
        for linear in (mlp.gate_up_proj, mlp.down_proj):
            linear.weight.normal_(std=0.2)
    x = torch.randn(11, 64)
    expected = mlp(x)

    mlp.pack(rows_hint=8)
    mlp.down_proj.pack(rows_hint=8)

    assert mlp.gated_in_kernel
    assert mlp.gate_up_proj.weight.is_meta  # the packed copy is the only one
    torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-5)
