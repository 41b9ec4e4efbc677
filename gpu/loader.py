"""Load a Hugging Face checkpoint folder's safetensors weights into Baton's `CausalLM`.

Separate q/k/v and gate/up tensors land in slices of the fused `qkv_proj` and `gate_up_proj`
parameters (Phi-3 saves them fused already); each expert's tensors land in its slice of the
stacked expert parameters; Gemma's (1 + w) norm weights are stored with the one added; a
checkpoint without `lm_head.weight` gets tied embeddings.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import LOAD_FORMATS
from baton.gpu.models.model import CausalLM
from baton.gpu.models.moe import SparseMoE

# Baton's fused projections and the checkpoint's tensors that fill them, in order.
SPLIT_PROJECTIONS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
# The checkpoint's names of an expert's (gate, up, down) projections, by MoE layout, and of
# the MoE block and its router.
EXPERT_PROJECTIONS = {
    "mixtral": ("w1", "w3", "w2"),
    "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
}
MOE_BLOCK = {"mixtral": "block_sparse_moe", "qwen3_moe": "mlp"}
# Buffers some older checkpoints saved that Baton recomputes.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
# The decoder layer a checkpoint tensor belongs to.
LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


class CheckpointError(ValueError):
    """A checkpoint folder whose weights do not fit its config.json or cannot be read."""


def safetensors_files(path: Path) -> list[Path]:
    """The weight files of a checkpoint: the shards its index lists, else every `*.safetensors`."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / shard for shard in shards]
    else:
        files = sorted(path.glob("*.safetensors"))
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"{path} lists weight files that are not there: {missing}")
    if not files:
        raise CheckpointError(
            f"no *.safetensors in {path}; Baton loads safetensors only (convert *.bin with "
            "transformers' save_pretrained)"
        )
    return files


def checkpoint_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every (name, tensor) of the checkpoint, each read through a mapping of its own.

    A safe_open handle maps its whole file, and every page a tensor read touched stays in the
    process's resident set until the handle closes: over one file that is the whole checkpoint
    beside the model's own copy, twice the weights at the peak. A handle per tensor lets each
    tensor's pages go once it has been copied.
    """
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as f:
            names = list(f.keys())
        for name in names:
            with safe_open(file, framework="pt") as f:
                tensor = f.get_tensor(name)
            yield name, tensor
            del tensor


def checkpoint_tensor_names(path: Path) -> set[str]:
    """The names of the checkpoint's tensors, read from the file headers alone."""
    names: set[str] = set()
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as f:
            names.update(f.keys())
    return names


def load_model(
    config: ModelConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    max_positions: int | None = None,
    load_format: str = "auto",
    on_layer_loaded: Callable[[nn.Module], object] | None = None,
) -> CausalLM:
    """Build the model on `device` in `dtype` with the weights of the checkpoint `config.path`.

    `load_format="dummy"` reads no weights: random ones from config.json alone, for benchmarking
    an architecture's shape without downloading it. `on_layer_loaded(layer)` runs on each
    decoder layer once all its weights are in (in whatever order the checkpoint holds them):
    `--quantization int8` quantizes there, so with checkpoints saved layer by layer the float
    weights are resident one layer at a time.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"--load-format must be one of {', '.join(LOAD_FORMATS)}")
    dummy = load_format == "dummy"
    tied = config.tie_word_embeddings or (
        not dummy and "lm_head.weight" not in checkpoint_tensor_names(config.path)
    )
    # Built on the meta device so no memory is spent on random initial weights, then given
    # memory with torch.empty: `to_empty` calls empty_like, whose meta-tensor path is torch's
    # Python reference, which imports sympy (seconds of a cold start).
    with torch.device("meta"):
        model = CausalLM(config, max_positions, device, tie_word_embeddings=tied)
    model = model.to(dtype)._apply(
        lambda t: torch.empty(t.shape, dtype=t.dtype, device=device) if t.is_meta else t
    )
    model.requires_grad_(False)
    if dummy:
        init_dummy_weights(model)
        for layer in model.layers if on_layer_loaded is not None else ():
            on_layer_loaded(layer)
    else:
        load_weights(model, config, checkpoint_tensors(config.path), on_layer_loaded)
    return model.eval()


def init_dummy_weights(model: CausalLM, seed: int = 0) -> None:
    """Norms at one, everything else normal with std 0.02 (transformers' initializer range),
    drawn on the model's device so an 8B shape fills in seconds; the same seed, the same model."""
    generator = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)


def load_weights(
    model: CausalLM,
    config: ModelConfig,
    tensors: Iterator[tuple[str, torch.Tensor]],
    on_layer_loaded: Callable[[nn.Module], object] | None = None,
) -> None:
    """Copy HF-named `tensors` into `model`; raise if one is unexpected or any is missing.
    `on_layer_loaded(layer)` runs on each decoder layer as its last tensor is copied."""
    slots = _weight_slots(model, config)
    unfilled = set(slots)
    # Each decoder layer's slot names, and those of them still to come.
    layer_slots: defaultdict[int, list[str]] = defaultdict(list)
    for name in slots:
        if match := LAYER_INDEX.match(name):
            layer_slots[int(match.group(1))].append(name)
    layer_waits = {index: set(names) for index, names in layer_slots.items()}
    # Names whose slots went to the hook with their layer: seen again, a tensor came twice.
    hooked_names: set[str] = set()
    for hf_name, tensor in tensors:
        if hf_name.endswith(IGNORED_SUFFIXES):
            continue
        if hf_name == "lm_head.weight" and model.lm_head is None:
            continue  # tied: transformers ignores a saved head too
        target = slots.get(hf_name)
        if target is None and hf_name in hooked_names:
            raise CheckpointError(f"{config.path} holds the tensor {hf_name!r} twice")
        if target is None:
            raise CheckpointError(
                f"{config.path} has a tensor {hf_name!r} that a {config.architecture} with this "
                "config.json does not use; does config.json belong to these weights?"
            )
        if target.shape != tensor.shape:
            raise CheckpointError(
                f"{hf_name} in {config.path} has shape {tuple(tensor.shape)}, but config.json "
                f"implies {tuple(target.shape)}"
            )
        with torch.no_grad():
            target.copy_(tensor)
            if config.gemma and hf_name.endswith("norm.weight"):
                # Gemma normalizes with (1 + w); stored so, its norms are Llama's.
                target.add_(1.0)
        unfilled.discard(hf_name)
        if on_layer_loaded is not None and (match := LAYER_INDEX.match(hf_name)):
            index = int(match.group(1))
            layer_waits[index].discard(hf_name)
            if not layer_waits[index]:
                # The slots would keep the layer's old parameters alive past the hook.
                for name in layer_slots[index]:
                    del slots[name]
                hooked_names.update(layer_slots[index])
                del target
                on_layer_loaded(model.layers[index])
    if unfilled:
        shown = ", ".join(sorted(unfilled)[:5])
        raise CheckpointError(f"{config.path} lacks {len(unfilled)} weight tensors: {shown}")


def _weight_slots(model: CausalLM, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Each checkpoint tensor name the model needs -> the parameter, or slice of one, it fills."""
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    split_sizes = {
        "qkv_proj": (q_size, kv_size, kv_size),
        "gate_up_proj": (config.intermediate_size, config.intermediate_size),
    }
    slots: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        *module, projection, kind = name.split(".")
        prefix = "" if projection == "lm_head" else "model."
        layer, _, moe_param = name.partition(".mlp.")
        if moe_param and isinstance(model.get_submodule(f"{layer}.mlp"), SparseMoE):
            slots.update(_expert_slots(f"model.{layer}", moe_param, param, config))
            continue
        if projection not in SPLIT_PROJECTIONS or config.fused_checkpoint:
            slots[prefix + name] = param
            continue
        offset = 0
        parts = zip(SPLIT_PROJECTIONS[projection], split_sizes[projection], strict=True)
        for part, size in parts:
            slots[prefix + ".".join([*module, part, kind])] = param.detach().narrow(0, offset, size)
            offset += size
    return slots


def _expert_slots(
    layer: str, parameter: str, param: torch.Tensor, config: ModelConfig
) -> dict[str, torch.Tensor]:
    """The checkpoint names that fill `parameter` of layer `layer`'s `SparseMoE`."""
    block = f"{layer}.{MOE_BLOCK[config.moe]}"  # type: ignore[index]
    gate, up, down = EXPERT_PROJECTIONS[config.moe]  # type: ignore[index]
    size = config.moe_intermediate_size
    if parameter == "gate.weight":  # the router
        return {f"{block}.gate.weight": param}
    slots = {}
    for expert in range(config.num_experts):
        prefix = f"{block}.experts.{expert}"
        if parameter == "gate_up_proj":
            slots[f"{prefix}.{gate}.weight"] = param[expert].narrow(0, 0, size)
            slots[f"{prefix}.{up}.weight"] = param[expert].narrow(0, size, size)
        else:
            slots[f"{prefix}.{down}.weight"] = param[expert]
    return slots
