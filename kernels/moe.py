"""Mixture-of-experts routing and expert computation, in plain torch.

`route` picks each token's top-k experts from the router's logits. `moe_experts` runs them the
way the CPU path does: the (token, expert) pairs sorted by expert, each expert's tokens one
contiguous slice and two matmuls, so a step costs one pass per expert that has tokens, never a
loop over tokens. `moe_experts_ref` is the plain definition it is tested against: every expert
on every token, weighted by the routing (zero for experts not picked).

With `--quantization int8` the stacked expert weights are int8 codes with a scale per output
row, and baton.gpu.models.moe hands `moe_experts` an expert MLP over `int8_linear`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

GatedActivation = Callable[[torch.Tensor], torch.Tensor]


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in the logits' dtype, expert ids [T, k]): softmax in float32, top-k,
    and with `renormalize` the k weights rescaled to sum to one (Mixtral always, Qwen3-MoE when
    its config's `norm_topk_prob` says so)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), expert_ids


# One expert's gated MLP on the rows routed to it: (expert, [n, H]) -> [n, H].
ExpertMLP = Callable[[int, torch.Tensor], torch.Tensor]


def stacked_expert_mlp(
    gate_up: torch.Tensor, down: torch.Tensor, act_and_mul: GatedActivation
) -> ExpertMLP:
    """The experts' MLP over stacked weights: gate_up [E, 2I, H], down [E, H, I]."""

    def expert_mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
        return F.linear(act_and_mul(F.linear(x, gate_up[expert])), down[expert])

    return expert_mlp


def moe_experts(
    hidden: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    num_experts: int,
    expert_mlp: ExpertMLP,
) -> torch.Tensor:
    """The weighted sum of each token's experts: hidden [T, H], weights and expert_ids [T, k]
    -> [T, H]. `expert_mlp` runs one expert on its rows (over stacked float weights, or
    packed ones: baton.gpu.models.moe)."""
    top_k = expert_ids.shape[1]
    flat_ids = expert_ids.reshape(-1)
    # Stable, so a token's pairs keep their order within an expert whatever the batch.
    order = torch.argsort(flat_ids, stable=True)
    token_of_pair = order // top_k
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    inputs = hidden.index_select(0, token_of_pair)
    outputs = torch.empty_like(inputs)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        outputs[rows] = expert_mlp(expert, inputs[rows])
        start += count
    outputs *= weights.reshape(-1).index_select(0, order)[:, None]
    combined = torch.zeros_like(hidden)
    return combined.index_add_(0, token_of_pair, outputs)


def moe_experts_ref(
    hidden: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    act_and_mul: GatedActivation,
) -> torch.Tensor:
    """`moe_experts` by its definition: every expert on every token, each weighted by the
    token's routing weight for it."""
    num_experts = gate_up.shape[0]
    dense_weights = torch.zeros(
        hidden.shape[0], num_experts, dtype=weights.dtype, device=hidden.device
    )
    dense_weights.scatter_(1, expert_ids, weights)
    out = torch.zeros_like(hidden)
    for expert in range(num_experts):
        expert_out = F.linear(act_and_mul(F.linear(hidden, gate_up[expert])), down[expert])
        out += dense_weights[:, expert, None] * expert_out
    return out
