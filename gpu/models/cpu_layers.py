"""A step's decoder layers in one C++ call on the CPU (kernels/csrc/decoder_layers_cpu.cpp).

The C++ side runs the kernels gpu/models/model.py's layers call, in the same order, so the hidden
states are the Python forward's bit for bit; what it removes is the Python between them. It takes
plain decoder layers only (Llama's shape: no q/k norms, no Gemma norms, no MoE, no sliding window or
soft-capping), each linear int8 (gpu/models/quantization.py) or packed float32, and steps whose
every row, prefill or decode, the C++ attention kernel serves. Anything else runs the layers in
Python.
"""

from __future__ import annotations

import torch
from torch import nn

from baton.gpu.model_inputs import AttentionMetadata
from baton.gpu.models.model import MLP, CausalLM, Linear
from baton.gpu.models.quantization import Int8Linear
from baton.kernels import ops
from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.int8_linear import is_packed

LinearSlots = tuple[torch.Tensor, torch.Tensor | None]


def _linear_slots(module: nn.Module) -> LinearSlots | None:
    """(weight, scales) of a linear the C++ side runs, or None: int8 codes packed for Baton's
    kernel, or a float weight packed for the CPU (baton.gpu.models.model.pack_cpu_weight)."""
    if isinstance(module, Int8Linear) and is_packed(module.weight):
        return module.weight, module.scales
    if isinstance(module, Linear) and module.packed_weight is not None:
        return module.packed_weight, None  # float32: Baton's kernel or oneDNN
    return None


class CpuLayers:
    """The model's decoder layers as the one C++ op takes them, built once the weights are in
    their final form (quantized and packed)."""

    def __init__(self, model: CausalLM, weights: list[torch.Tensor | None]) -> None:
        config, first = model.config, model.layers[0]
        self.embed_tokens = model.embed_tokens
        self.weights = weights
        self.final_norm = model.norm.weight
        self.cos_sin_cache = first.self_attn.cos_sin_cache
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.intermediate_size = config.intermediate_size
        self.scale = first.self_attn.scale
        self.eps = config.rms_norm_eps
        # The gate the MLP was built with (ops.gated_activation: SiLU or GeLU-tanh).
        self.gelu = first.mlp.gelu

    @classmethod
    def of(cls, model: CausalLM) -> CpuLayers | None:
        """The one-call path for `model`, or None where it does not apply."""
        config = model.config
        if (
            model.embed_tokens.weight.device.type != "cpu"
            or model.embed_tokens.weight.dtype != torch.float32
            or model.embed_scale is not None
            or config.gemma
            or config.qk_norm
            or config.attn_logit_softcap is not None
            or not cpu_kernels_available()
        ):
            return None
        weights: list[torch.Tensor | None] = []
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            if config.layer_window(i) is not None or not isinstance(mlp, MLP):
                return None
            slots = []
            for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                linear_slots = _linear_slots(linear)
                if linear_slots is None:
                    return None
                slots.append(linear_slots)
            qkv, o, gate_up, down = slots
            # The C++ side reads a float32 gate_up of Baton's kernel in the gated layout.
            plain_f32 = gate_up[1] is None and not gate_up[0].is_mkldnn
            if plain_f32 and not mlp.gated_in_kernel:
                return None
            weights += [layer.input_layernorm.weight, *qkv, attn.qkv_proj.bias]
            weights += [*o, attn.o_proj.bias, layer.post_attention_layernorm.weight]
            weights += [*gate_up, *down]
        return cls(model, weights)

    def takes(self, input_ids: torch.Tensor, attn_metadata: AttentionMetadata) -> bool:
        """Whether this step runs here: the C++ attention kernel serves every token, and no
        kernel choice is forced (tests force the references or Triton)."""
        plan = attn_metadata.cpu_plan
        return (
            plan is not None
            and plan.use_kernel
            and plan.kernel_rows.numel() == input_ids.shape[0]
            and ops.kernels_chosen_by_device()
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        kv_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        """The final-normed hidden state of every token, as `CausalLM.forward` returns it."""
        plan = attn_metadata.cpu_plan
        assert plan is not None
        return torch.ops.baton_cpu.decoder_layers(
            self.embed_tokens(input_ids),
            positions,
            self.cos_sin_cache,
            kv_caches,
            attn_metadata.slot_mapping,
            attn_metadata.block_tables,
            plan.kernel_lens,
            plan.kernel_rows,
            plan.kernel_seqs,
            self.weights,
            self.final_norm,
            self.num_heads,
            self.num_kv_heads,
            self.intermediate_size,
            self.scale,
            self.eps,
            self.gelu,
        )


def streamed_weights(model: CausalLM) -> list[torch.Tensor]:
    """What a CPU step reads in full, once per step: every linear weight packed for Baton's
    kernels (float32 panels or int8 codes), the LM head's included. oneDNN's packed weights are
    opaque tensors and are left out."""
    weights = [
        slots[0]
        for module in model.modules()
        if (slots := _linear_slots(module)) is not None and not slots[0].is_mkldnn
    ]
    logits = model.packed_logits_weight
    if logits is not None and not logits.is_mkldnn:
        weights.append(logits)
    return weights
