"""The CPU's C++ layer operations (kernels/csrc/layer_ops_cpu.cpp) against their plain-torch
references: RMSNorm alone and with the residual add, the gated activations, and rotary with the
KV-cache write; and a row's result does not depend on the rows beside it."""

from __future__ import annotations

import pytest
import torch

from baton.core.checkpoint.model_config import RopeConfig
from baton.kernels import ops
from baton.kernels.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.kv_cache import write_kv_cache_ref
from baton.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from baton.kernels.rotary import apply_rotary_ref, build_cos_sin_cache

# A decode step's rows, a few, and a prefill chunk's, split across threads.
ROWS = [1, 3, 97]


@pytest.fixture(autouse=True)
def kernels_built():
    # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
    assert cpu_kernels_available()


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("rows", ROWS)
def test_rms_norm_equals_the_reference(rows):
    torch.manual_seed(rows)
    x, weight = torch.randn(rows, 384) * 3, torch.randn(384)
    close(torch.ops.baton_cpu.rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6))


@pytest.mark.parametrize("rows", ROWS)
def test_fused_add_rms_norm_equals_the_reference_and_returns_the_sum(rows):
    torch.manual_seed(rows)
    x, residual, weight = torch.randn(rows, 256), torch.randn(rows, 256), torch.randn(256)
    x_before, residual_before = x.clone(), residual.clone()
    normed, new_residual = torch.ops.baton_cpu.fused_add_rms_norm(x, residual, weight, 1e-5)
    expected_normed, expected_residual = fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    close(normed, expected_normed)
    assert torch.equal(new_residual, expected_residual)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # inputs untouched


def test_norms_read_rows_with_a_stride():
    # A column slice of a wider tensor: rows are contiguous, the row stride is not the width.
    wide, weight = torch.randn(5, 300), torch.randn(200)
    x = wide[:, 50:250]
    close(torch.ops.baton_cpu.rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6))


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(
    ("op", "reference"),
    [("silu_and_mul", silu_and_mul_ref), ("gelu_tanh_and_mul", gelu_tanh_and_mul_ref)],
)
def test_gated_activations_equal_the_reference(rows, op, reference):
    torch.manual_seed(rows)
    x = torch.randn(rows, 2 * 176) * 4
    close(getattr(torch.ops.baton_cpu, op)(x), reference(x))


def rotary_case(num_tokens: int, slots: list[int]):
    num_heads, num_kv_heads, head_dim, num_blocks, block_size = 4, 2, 16, 6, 4
    cos_sin = build_cos_sin_cache(RopeConfig(theta=10000.0), head_dim, 64)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim)
    positions = torch.randint(0, 64, (num_tokens,))
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim)
    return qkv, positions, cos_sin, cache, torch.tensor(slots), (num_heads, num_kv_heads, head_dim)


@pytest.mark.parametrize("slots", [[5], [0, 23, 7], [3, -1, 9, -1]])
def test_rotary_and_cache_write_equal_the_references(slots):
    torch.manual_seed(len(slots))
    qkv, positions, cos_sin, cache, slot_mapping, (hq, hkv, d) = rotary_case(len(slots), slots)
    expected_cache = cache.clone()
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    t = qkv.shape[0]
    expected_q, expected_k = apply_rotary_ref(
        q.view(t, hq, d), k.view(t, hkv, d), positions, cos_sin
    )
    write_kv_cache_ref(expected_k, v.view(t, hkv, d), expected_cache, slot_mapping)

    actual_q = torch.ops.baton_cpu.rotary_and_cache_kv(
        qkv, positions, cos_sin, cache, slot_mapping, hq, hkv
    )
    close(actual_q, expected_q)
    close(cache, expected_cache)  # stored slots rotated, the rest (and padding's) untouched


def test_rotary_rejects_a_slot_outside_the_cache():
    qkv, positions, cos_sin, cache, _, (hq, hkv, _d) = rotary_case(1, [0])
    with pytest.raises(RuntimeError, match="a slot is outside the KV cache"):
        torch.ops.baton_cpu.rotary_and_cache_kv(
            qkv, positions, cos_sin, cache, torch.tensor([10_000]), hq, hkv
        )


def test_a_row_has_the_same_bits_alone_and_among_many():
    torch.manual_seed(0)
    x, residual, weight = torch.randn(64, 512), torch.randn(64, 512), torch.randn(512)
    gate_up = torch.randn(64, 2 * 1024)
    batched = torch.ops.baton_cpu.fused_add_rms_norm(x, residual, weight, 1e-6)[0]
    alone = torch.ops.baton_cpu.fused_add_rms_norm(x[40:41], residual[40:41], weight, 1e-6)[0]
    assert torch.equal(batched[40:41], alone)
    assert torch.equal(
        torch.ops.baton_cpu.silu_and_mul(gate_up)[40:41],
        torch.ops.baton_cpu.silu_and_mul(gate_up[40:41]),
    )


def test_dispatch_takes_the_kernels_for_float32_cpu_rows_only():
    rows = torch.randn(2, 8)
    assert ops.uses_cpu_kernels(rows)
    assert not ops.uses_cpu_kernels(rows.double())
    assert not ops.uses_cpu_kernels(rows.view(2, 2, 4))  # q/k norms' heads go to the reference
    with ops.force_reference():
        assert not ops.uses_cpu_kernels(rows)


@pytest.mark.parametrize(
    ("op", "reference"),
    [("silu_and_mul", silu_and_mul_ref), ("gelu_tanh_and_mul", gelu_tanh_and_mul_ref)],
)
def test_gates_at_the_ends_of_the_float_range_are_torchs(op, reference):
    # Past an exponent of -87 the kernels' e^-|x| is 0: a gate is x above and -0 below, NaN at
    # -inf (-inf * 0) and inf at inf, as torch's is; the up half is 1 so the gate shows through.
    gate = torch.tensor([-1e38, -100.0, -88.0, -87.0, -20.0, -3.0, -1e-30, 0.0, 3.0, 88.0, 1e38])
    gate = torch.cat([gate, torch.tensor([float("inf"), float("-inf")])])
    x = torch.cat([gate, torch.ones_like(gate)]).view(1, -1)
    torch.testing.assert_close(
        getattr(torch.ops.baton_cpu, op)(x), reference(x), atol=1e-30, rtol=2e-5, equal_nan=True
    )
