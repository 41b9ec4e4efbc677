"""`--quantization int8`: weight-only int8 for the native model on the CPU, quantized at load
from a float checkpoint: each `Linear` of the decoder layers and the LM head swapped for an
`Int8Linear`, and each MoE layer's stacked expert weights replaced by int8 codes and scales
(baton.kernels.int8_linear).

What stays float: the embedding table (a lookup, not a matmul), the norms and the MoE router
(tiny). The LM head is int8 as in llama.cpp's Q8_0 files: kept in float32 it would be
a large share of the bytes a decode step reads, and greedy outputs still agree with float32's but
at near ties (docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from baton.core.kv_cache.host_memory import release_freed_heap
from baton.gpu.models.model import CausalLM, Linear
from baton.gpu.models.moe import SparseMoE
from baton.kernels.int8_linear import int8_linear, kernel_layout, quantize_per_channel


class Int8Linear(nn.Module):
    """A linear layer over int8 weights [out, in] and one float scale per output row, the codes
    kept in the C++ kernel's packed layout where it will run them (baton.kernels.int8_linear).

    The codes and scales are parameters (frozen), so the model's parameter bytes are its
    weight memory."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = nn.Parameter(codes, requires_grad=False)
        self.scales = nn.Parameter(scales, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_float(cls, linear: nn.Linear) -> Int8Linear:
        return cls.from_weight(linear.weight, linear.bias)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        codes, scales = quantize_per_channel(weight)
        codes = kernel_layout(codes, scales.dtype)
        return cls(codes, scales, None if bias is None else bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.weight, self.scales, self.bias)


def check_quantization(quantization: str, model_impl: str, device: torch.device) -> None:
    """Refuse, before any weight loads, a quantization this model and device cannot run."""
    if quantization == "none":
        return
    if device.type != "cpu":
        raise ValueError(
            f"--quantization {quantization} runs on the CPU only (Baton's C++ int8 kernel); "
            "on CUDA drop it and use --dtype bfloat16, or pass --device cpu"
        )
    if model_impl != "native":
        raise ValueError(
            f"--quantization {quantization} needs Baton's native model; this checkpoint runs on "
            "the generic path (transformers' code), which supports --quantization none only"
        )


def quantize_lm_head(model: CausalLM) -> None:
    """Run the LM head over int8 weights: its own, or with tied embeddings an int8 copy of the
    table (the lookups keep the float table)."""
    weight = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    model.lm_head = Int8Linear.from_weight(weight)


def quantize_decoder_layers(model: CausalLM) -> int:
    """Quantize every decoder layer (`quantize_layer`); returns how many int8 weight tensors
    there are now."""
    return sum(quantize_layer(layer) for layer in model.layers)


def quantize_layer(layer: nn.Module) -> int:
    """Quantize the weights of one decoder layer's linear layers and MoE experts in place,
    freeing each float weight as it goes; returns how many int8 weight tensors it made. The
    loader calls it as each layer's last weight arrives (`quantize_as_loaded`)."""
    quantized = 0
    for name, module in list(layer.named_modules()):
        if isinstance(module, Linear):
            parent_name, _, child = name.rpartition(".")
            layer.get_submodule(parent_name).register_module(child, Int8Linear.from_float(module))
            quantized += 1
        elif isinstance(module, SparseMoE):
            module.gate_up_proj, module.gate_up_scales = _int8_stack(module.gate_up_proj)
            module.down_proj, module.down_scales = _int8_stack(module.down_proj)
            quantized += 2
    return quantized


def quantize_as_loaded(counts: list[int]) -> Callable[[nn.Module], None]:
    """The loader's per-layer hook for `--quantization int8`: quantize the layer just loaded
    (its int8 tensor count appended to `counts`) and return the freed float weights and the
    quantizer's temporaries to the system. With checkpoints saved layer by layer, the float
    model is then never resident whole: the load peaks at one float layer beside the int8
    model, not at the whole float model (docs/decisions.md)."""

    def quantize(layer: nn.Module) -> None:
        counts.append(quantize_layer(layer))
        release_freed_heap()

    return quantize


def _int8_stack(stacked: torch.Tensor) -> tuple[nn.Parameter, nn.Parameter]:
    """(codes, scales [E, out]) of stacked expert weights [E, out, in]: the codes [E, out, in],
    or each expert's packed for the C++ kernel where it will run them."""
    codes, scales = quantize_per_channel(stacked.flatten(0, 1))
    codes = kernel_layout(codes.view(stacked.shape), scales.dtype)
    return (
        nn.Parameter(codes, requires_grad=False),
        nn.Parameter(scales.view(stacked.shape[:2]), requires_grad=False),
    )
