"""The sparse mixture-of-experts MLP of Mixtral and Qwen3-MoE: a router picks each token's
top-k experts and the experts run batched by expert (kernels.moe)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.model_config import ModelConfig
from kernels import ops
from kernels.linear import onednn_linear, pack_linear_weight
from kernels.moe import ExpertMLP, moe_experts, route, stacked_expert_mlp


class SparseMoE(nn.Module):
    """`gate` is the router ([E, hidden]); every expert's gate and up projections are stacked
    in `gate_up_proj` [E, 2I, hidden] and its down projection in `down_proj` [E, hidden, I].

    On the CPU in float32 the experts run through oneDNN over packed weights, as the dense
    layers do (`pack`); the stacked float weights are then dropped (left as meta tensors).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        experts, size = config.num_experts, config.moe_intermediate_size
        self.num_experts = experts
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * size, config.hidden_size))
        self.down_proj = nn.Parameter(torch.empty(experts, config.hidden_size, size))
        self.act_and_mul = ops.gated_activation(config.hidden_act)
        self.packed_experts: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = route(
            F.linear(hidden, self.gate.weight), self.top_k, self.renormalize
        )
        return moe_experts(hidden, weights, expert_ids, self.num_experts, self._expert_mlp())

    def pack(self, rows_hint: int) -> None:
        """Reorder each expert's two projections for oneDNN (kernels.linear)."""
        self.packed_experts = [
            (pack_linear_weight(gate_up, rows_hint), pack_linear_weight(down, rows_hint))
            for gate_up, down in zip(self.gate_up_proj, self.down_proj, strict=True)
        ]
        self.gate_up_proj = nn.Parameter(self.gate_up_proj.to("meta"), requires_grad=False)
        self.down_proj = nn.Parameter(self.down_proj.to("meta"), requires_grad=False)

    def _expert_mlp(self) -> ExpertMLP:
        if self.packed_experts is None:
            return stacked_expert_mlp(self.gate_up_proj, self.down_proj, self.act_and_mul)
        packed = self.packed_experts

        def expert_mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            gate_up, down = packed[expert]
            return onednn_linear(self.act_and_mul(onednn_linear(x, gate_up, None)), down, None)

        return expert_mlp
