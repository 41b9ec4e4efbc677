"""Mixture-of-experts kernels against their references: routing as transformers' Mixtral and
Qwen3-MoE routers compute it, and the expert computation batched by expert equal to every
expert on every token weighted by the routing."""

from __future__ import annotations

import pytest
import torch

from baton.gpu.models.moe import int8_expert_mlp
from baton.kernels.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from baton.kernels.int8_linear import dequantize, quantize_per_channel
from baton.kernels.moe import moe_experts, moe_experts_ref, route, stacked_expert_mlp


@pytest.mark.parametrize("renormalize", [True, False])
def test_route_picks_the_top_k_softmax_weights(renormalize):
    torch.manual_seed(0)
    logits = torch.randn(7, 8)
    weights, expert_ids = route(logits, 2, renormalize)
    probs = logits.softmax(-1)
    for token in range(7):
        top = probs[token].topk(2)
        assert expert_ids[token].tolist() == top.indices.tolist()
        expected = top.values / top.values.sum() if renormalize else top.values
        torch.testing.assert_close(weights[token], expected)


@pytest.mark.parametrize("act", [silu_and_mul_ref, gelu_tanh_and_mul_ref])
@pytest.mark.parametrize(
    ("num_tokens", "num_experts", "top_k"), [(1, 4, 2), (37, 8, 2), (64, 8, 3)]
)
def test_batched_experts_equal_every_expert_weighted(act, num_tokens, num_experts, top_k):
    torch.manual_seed(num_tokens)
    hidden_size, size = 32, 24
    hidden = torch.randn(num_tokens, hidden_size)
    gate_up = torch.randn(num_experts, 2 * size, hidden_size) * 0.1
    down = torch.randn(num_experts, hidden_size, size) * 0.1
    weights, expert_ids = route(torch.randn(num_tokens, num_experts), top_k, True)
    expected = moe_experts_ref(hidden, gate_up, down, weights, expert_ids, act)
    actual = moe_experts(
        hidden, weights, expert_ids, num_experts, stacked_expert_mlp(gate_up, down, act)
    )
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_a_token_gets_the_same_result_alone_and_in_a_batch():
    torch.manual_seed(1)
    hidden = torch.randn(50, 16)
    gate_up, down = torch.randn(4, 20, 16), torch.randn(4, 16, 10)
    weights, expert_ids = route(torch.randn(50, 4), 2, True)
    mlp = stacked_expert_mlp(gate_up, down, silu_and_mul_ref)
    batched = moe_experts(hidden, weights, expert_ids, 4, mlp)
    alone = moe_experts(hidden[7:8], weights[7:8], expert_ids[7:8], 4, mlp)
    torch.testing.assert_close(batched[7:8], alone, atol=1e-6, rtol=1e-6)


def test_int8_experts_equal_the_reference_over_their_dequantized_weights():
    torch.manual_seed(2)
    hidden = torch.randn(37, 32)
    gate_up_codes, gate_up_scales = quantize_per_channel(torch.randn(8 * 48, 32) * 0.1)
    down_codes, down_scales = quantize_per_channel(torch.randn(8 * 32, 24) * 0.1)
    weights, expert_ids = route(torch.randn(37, 8), 2, True)
    gate_up = dequantize(gate_up_codes, gate_up_scales).view(8, 48, 32)
    down = dequantize(down_codes, down_scales).view(8, 32, 24)
    expected = moe_experts_ref(hidden, gate_up, down, weights, expert_ids, silu_and_mul_ref)

    actual = moe_experts(
        hidden,
        weights,
        expert_ids,
        8,
        int8_expert_mlp(
            gate_up_codes.view(8, 48, 32),
            gate_up_scales.view(8, 48),
            down_codes.view(8, 32, 24),
            down_scales.view(8, 32),
            silu_and_mul_ref,
        ),
    )

    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
