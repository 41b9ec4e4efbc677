"""gpt-oss's mixture-of-experts MLP: a biased router whose chosen top-k logits are softmaxed,
and experts with biases and a clamped SwiGLU, in the checkpoint's own layout.

The parameters keep transformers' names and shapes (`router.weight`/`bias`,
`experts.gate_up_proj` [E, hidden, 2I] with each expert's gate and up channels interleaved,
`experts.down_proj` [E, I, hidden] and their biases), so the loader fills them by name. On the
CPU each expert's two projections are packed for oneDNN as Baton's other experts are (`pack`).
"""

from __future__ import annotations

import torch
from torch import nn

from baton.core.checkpoint.model_config import ModelConfig
from baton.kernels.linear import onednn_linear, pack_linear_weight
from baton.kernels.moe import ExpertMLP, moe_experts


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's gate over interleaved [gate, up] channels [n, 2I] -> [n, I]: the gate clamped
    above at `limit`, up clamped to [-limit, limit], then (up + 1) * gate * sigmoid(alpha gate)."""
    gate = gate_up[:, ::2].clamp(max=limit)
    up = gate_up[:, 1::2].clamp(min=-limit, max=limit)
    # In place on the clamped copies: three fewer temporaries a call, the same products.
    glu = torch.mul(gate, alpha).sigmoid_().mul_(gate)
    return up.add_(1).mul_(glu)


def route_chosen(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], expert ids [T, k]): the top-k logits, softmaxed among themselves."""
    top_logits, expert_ids = torch.topk(router_logits, top_k, dim=-1)
    return torch.softmax(top_logits, dim=-1), expert_ids


class GptOssExperts(nn.Module):
    """Every expert's stacked projections and biases, as transformers' GptOssExperts holds
    them."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        experts, hidden, size = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(experts, hidden, 2 * size))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(experts, 2 * size))
        self.down_proj = nn.Parameter(torch.empty(experts, size, hidden))
        self.down_proj_bias = nn.Parameter(torch.empty(experts, hidden))


class GptOssMoE(nn.Module):
    """The router (`router`, [E, hidden] with a bias) and the experts (`experts`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.alpha = config.swiglu_alpha
        self.limit = config.swiglu_limit
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=True)
        self.experts = GptOssExperts(config)
        self.packed_experts: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = route_chosen(self.router(hidden), self.top_k)
        return moe_experts(hidden, weights, expert_ids, self.num_experts, self._expert_mlp())

    def pack(self, rows_hint: int) -> None:
        """Each expert's two projections as [out, in] weights reordered for oneDNN; the stacked
        float weights are then dropped (left as meta tensors)."""
        experts = self.experts
        self.packed_experts = [
            (pack_linear_weight(gate_up.t(), rows_hint), pack_linear_weight(down.t(), rows_hint))
            for gate_up, down in zip(experts.gate_up_proj, experts.down_proj, strict=True)
        ]
        experts.gate_up_proj = nn.Parameter(experts.gate_up_proj.to("meta"), requires_grad=False)
        experts.down_proj = nn.Parameter(experts.down_proj.to("meta"), requires_grad=False)

    def _expert_mlp(self) -> ExpertMLP:
        experts, alpha, limit = self.experts, self.alpha, self.limit
        gate_up_bias, down_bias = experts.gate_up_proj_bias, experts.down_proj_bias
        packed = self.packed_experts
        if packed is None:

            def expert_mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
                gate_up = torch.addmm(gate_up_bias[expert], x, experts.gate_up_proj[expert])
                gated = clamped_swiglu(gate_up, alpha, limit)
                return torch.addmm(down_bias[expert], gated, experts.down_proj[expert])

            return expert_mlp

        def packed_expert_mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            gate_up_weight, down_weight = packed[expert]
            gate_up = onednn_linear(x, gate_up_weight, gate_up_bias[expert])
            gated = clamped_swiglu(gate_up, alpha, limit)
            return onednn_linear(gated, down_weight, down_bias[expert])

        return packed_expert_mlp
