"""The sparse mixture-of-experts MLP of Mixtral and Qwen3-MoE: a router picks each token's
top-k experts and the experts run batched by expert (baton.kernels.moe)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from baton.core.checkpoint.model_config import ModelConfig
from baton.kernels import ops
from baton.kernels.int8_linear import int8_linear
from baton.kernels.linear import onednn_linear, pack_linear_weight
from baton.kernels.moe import ExpertMLP, GatedActivation, moe_experts, route, stacked_expert_mlp


class SparseMoE(nn.Module):
    """`gate` is the router ([E, hidden]); every expert's gate and up projections are stacked
    in `gate_up_proj` [E, 2I, hidden] and its down projection in `down_proj` [E, hidden, I].

    On the CPU the float experts run through oneDNN over packed weights, as bfloat16 dense layers do
    (`pack`); the stacked float weights are then dropped (left as meta tensors). Quantized
    (baton.gpu.models.quantization), both stacks are int8 codes (each expert's packed for the C++
    kernel where it runs them) with scales per output row in `gate_up_scales` [E, 2I] and
    `down_scales` [E, hidden]; else the scales are None.
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
        self.gate_up_scales: nn.Parameter | None = None
        self.down_scales: nn.Parameter | None = None
        self.act_and_mul = ops.gated_activation(config.hidden_act)
        self.packed_experts: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = route(
            F.linear(hidden, self.gate.weight), self.top_k, self.renormalize
        )
        return moe_experts(hidden, weights, expert_ids, self.num_experts, self._expert_mlp())

    def pack(self, rows_hint: int) -> None:
        """Reorder each float expert's two projections for oneDNN (baton.kernels.linear); int8
        experts stay as they are."""
        if self.gate_up_scales is not None:
            return
        self.packed_experts = [
            (pack_linear_weight(gate_up, rows_hint), pack_linear_weight(down, rows_hint))
            for gate_up, down in zip(self.gate_up_proj, self.down_proj, strict=True)
        ]
        self.gate_up_proj = nn.Parameter(self.gate_up_proj.to("meta"), requires_grad=False)
        self.down_proj = nn.Parameter(self.down_proj.to("meta"), requires_grad=False)

    def _expert_mlp(self) -> ExpertMLP:
        if self.gate_up_scales is not None and self.down_scales is not None:
            return int8_expert_mlp(
                self.gate_up_proj,
                self.gate_up_scales,
                self.down_proj,
                self.down_scales,
                self.act_and_mul,
            )
        if self.packed_experts is None:
            return stacked_expert_mlp(self.gate_up_proj, self.down_proj, self.act_and_mul)
        packed = self.packed_experts

        def expert_mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            gate_up, down = packed[expert]
            return onednn_linear(self.act_and_mul(onednn_linear(x, gate_up, None)), down, None)

        return expert_mlp


def int8_expert_mlp(
    gate_up: torch.Tensor,
    gate_up_scales: torch.Tensor,
    down: torch.Tensor,
    down_scales: torch.Tensor,
    act_and_mul: GatedActivation,
) -> ExpertMLP:
    """The experts' MLP over stacked int8 codes ([E, out, in] or [E, packed...]) and their
    scales ([E, out])."""

    def expert_mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
        up = int8_linear(x, gate_up[expert], gate_up_scales[expert], None)
        return int8_linear(act_and_mul(up), down[expert], down_scales[expert], None)

    return expert_mlp
