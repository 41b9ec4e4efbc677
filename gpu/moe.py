"""The sparse mixture-of-experts MLP of Mixtral and Qwen3-MoE: a router picks each token's
top-k experts and the experts run batched by expert (kernels.moe)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.model_config import ModelConfig
from kernels import ops
from kernels.moe import moe_experts, route


class SparseMoE(nn.Module):
    """`gate` is the router ([E, hidden]); every expert's gate and up projections are stacked
    in `gate_up_proj` [E, 2I, hidden] and its down projection in `down_proj` [E, hidden, I].
    Quantized (gpu.quantization), both are int8 codes with scales per output row in
    `gate_up_scales` [E, 2I] and `down_scales` [E, hidden]; else the scales are None."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        experts, size = config.num_experts, config.moe_intermediate_size
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * size, config.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(experts, config.hidden_size, size))
        self.gate_up_scales: nn.Parameter | None = None
        self.down_scales: nn.Parameter | None = None
        self.act_and_mul = ops.gated_activation(config.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = route(
            F.linear(hidden, self.gate.weight), self.top_k, self.renormalize
        )
        return moe_experts(
            hidden,
            self.gate_up_proj,
            self.down_proj,
            weights,
            expert_ids,
            self.act_and_mul,
            self.gate_up_scales,
            self.down_scales,
        )
