"""The model as the executor steps it: loaded on its path (Baton's native decoder or
transformers' code), its weights quantized and packed as the flags ask, and on the CPU its
decoder layers gathered into one C++ call and its packed weights moved onto huge pages.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import EngineConfig
from baton.core.kv_cache.host_memory import format_size
from baton.gpu.huge_pages import huge_page_bytes, move_to_huge_pages
from baton.gpu.loader import load_model
from baton.gpu.models.cpu_layers import CpuLayers, streamed_weights
from baton.gpu.models.model import CausalLM, uses_f32_kernel
from baton.gpu.models.quantization import quantize_as_loaded, quantize_lm_head
from baton.gpu.models.transformers_model import TransformersCausalLM, load_transformers_model
from baton.kernels.cpu_extension import cpu_kernels_available

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreparedModel:
    """`config` is the checkpoint's, or on the generic path the one with the KV shape
    transformers' code was seen to hand attention; `cpu_layers` is None but on the CPU, for
    the native models whose layers the C++ call takes."""

    model: CausalLM | TransformersCausalLM
    config: ModelConfig
    cpu_layers: CpuLayers | None


def prepare_model(
    model_config: ModelConfig,
    engine_config: EngineConfig,
    device: torch.device,
    dtype: torch.dtype,
    max_model_len: int,
    load_format: str,
) -> PreparedModel:
    """Load `model_config`'s checkpoint onto `device` in `dtype` and make it ready to step."""
    quantization = engine_config.quantization
    int8_tensors: list[int] = []  # int8 weight tensors, per quantized decoder layer
    model: CausalLM | TransformersCausalLM
    if model_config.model_impl == "transformers":
        model = load_transformers_model(model_config, device, dtype, load_format)
        # The KV shape transformers' code was seen to hand attention, however config.json
        # spells it.
        model_config = model.config
    else:
        model = load_model(
            model_config,
            device,
            dtype,
            max_model_len,
            load_format,
            on_layer_loaded=quantize_as_loaded(int8_tensors) if quantization == "int8" else None,
        )
    logger.info(
        "model: %s on the %s path",
        model_config.architecture,
        "native" if model_config.model_impl == "native" else "generic (transformers' code)",
    )
    if quantization == "int8":
        num_int8 = sum(int8_tensors)
        quantize_lm_head(model)
        logger.info(
            "quantization int8: %d weight tensors of the decoder layers and the LM head in "
            "int8 with per-channel scales; embeddings, norms and MoE routers stay %s",
            num_int8,
            str(dtype).removeprefix("torch."),
        )
        if dtype != torch.float32 or not cpu_kernels_available():
            # Without Baton's C++ kernel, torch's int8 matmul, which runs slower than float32
            # at every batch size (docs/decisions.md).
            logger.warning(
                "--quantization int8 runs through torch's int8 matmul here (Baton's kernel "
                "takes float32 on a CPU whose C++ kernels built): it saves weight memory "
                "but runs slower than float32; use float32 where speed matters"
            )
    if model.pack_linear_weights(rows_hint=engine_config.max_num_seqs):
        # Both paths pack by the weights' dtype alike (PackedLinear does as the native model).
        f32 = uses_f32_kernel(torch.empty(0, dtype=dtype))
        logger.info(
            "float linear layers run over weights packed at load, in %s",
            "Baton's float32 kernel" if f32 else "oneDNN",
        )
    cpu_layers = None
    if device.type == "cpu":
        cpu_layers = _on_cpu(model)
    return PreparedModel(model, model_config, cpu_layers)


def _on_cpu(model: CausalLM | TransformersCausalLM) -> CpuLayers | None:
    """The native model's layers as one C++ call where it takes them; the weights a step reads
    in full moved onto transparent huge pages."""
    cpu_layers = None
    if isinstance(model, CausalLM):
        cpu_layers = CpuLayers.of(model)
        if cpu_layers is not None:
            logger.info("every step runs the decoder layers in one C++ call")
        weights = streamed_weights(model)
    else:
        weights = model.streamed_weights()
    moved = move_to_huge_pages(weights)
    if moved:
        logger.info(
            "packed weights: %s moved onto transparent huge pages (%s of them now)",
            format_size(moved),
            format_size(huge_page_bytes() or 0),
        )
    return cpu_layers
