"""The generic path: any transformers causal LM, run by transformers' own modeling code, with
Baton's paged KV cache plugged in through transformers' attention interface.

A step runs as Baton's native model does: every scheduled token of every sequence in one
[1, num_tokens] row with per-token position ids, nothing padded. transformers' layers compute
q/k/v and their rotary (or learned, or partial) positions; `paged_attention_forward`
(gpu/models/transformers_attention.py), registered as an attention implementation, runs
attention over Baton's blocks.
"""

from __future__ import annotations

import dataclasses
import inspect
from functools import cache

import torch
from torch import nn

from baton.core.checkpoint.model_config import ModelConfig
from baton.core.checkpoint.unsupported_model import RefusalReason, UnsupportedModelError
from baton.gpu.model_inputs import AttentionMetadata
from baton.gpu.models import generic_refusals
from baton.gpu.models.kernel_rms_norms import run_rms_norms_in_kernel
from baton.gpu.models.model import pack_cpu_weight, packed_linear, uses_f32_kernel
from baton.gpu.models.transformers_attention import (
    ATTN_IMPLEMENTATION,
    PagedStep,
    paged_attention_forward,
    running_step,
)
from baton.kernels.linear import onednn_linear_available


class PackedLinear(nn.Module):
    """An `nn.Linear` of transformers' model, run over its weight packed once by the native
    model's CPU kernels: Baton's float32 kernel where it built, else oneDNN.

    `weight` stays as a meta tensor of the same shape and dtype, for code that reads those; the
    packed copy is the only one in memory (a tied embedding keeps its own table).
    """

    def __init__(self, linear: nn.Linear, rows_hint: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = pack_cpu_weight(linear.weight, rows_hint)
        self.weight = nn.Parameter(linear.weight.detach().to("meta"), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = packed_linear(rows, self.packed_weight, self.bias, self.out_features)
        return out.view(*x.shape[:-1], self.out_features)


class _HiddenStates(nn.Module):
    """Stands in for the base model inside the transformers CausalLM, so that the CausalLM's own
    head, with any logit scaling or soft-capping its code applies, runs on given hidden states."""

    def forward(self, *args, inputs_embeds: torch.Tensor | None = None, **kwargs):
        return _base_output_class()(last_hidden_state=inputs_embeds)


@cache
def _base_output_class() -> type:
    """A base model's output holding only the last hidden state, whose every other field reads
    as None: a CausalLM's forward copies what its base returned (router logits of an MoE,
    cross-attentions, caches) into its own output, and none of them is computed here."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    class HeadInput(BaseModelOutputWithPast):
        def __getattr__(self, name: str) -> None:
            if name.startswith("__"):
                raise AttributeError(name)
            return None

    return HeadInput


class TransformersCausalLM(nn.Module):
    """A transformers causal LM behind the interface of Baton's `CausalLM`.

    `config` is the `ModelConfig` with the KV shape the modeling code was seen to use (one
    cache per attention call of a forward). The executor captures no CUDA graphs of it:
    transformers' code is not known to be free of host syncs.
    """

    def __init__(self, causal_lm: nn.Module, config: ModelConfig) -> None:
        super().__init__()
        parent, name = _called_base(causal_lm)
        self.base = getattr(parent, name)
        setattr(parent, name, _HiddenStates())
        self.causal_lm = causal_lm
        self.config = self._probed_config(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        kv_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        """The final hidden state of every packed token: [T, hidden_size]."""
        step = PagedStep(attn_metadata, kv_caches, positions, self.layers)
        hidden = self._run(step, input_ids, positions)
        if step.num_calls != len(kv_caches):
            raise RuntimeError(
                f"{step.num_calls} attention calls in a forward, but {len(kv_caches)} KV caches"
            )
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits [N, vocab_size] for the hidden states [N, hidden_size] given."""
        out = self.causal_lm(inputs_embeds=hidden.unsqueeze(0), use_cache=False)
        return out.logits[0]

    def pack_linear_weights(self, rows_hint: int) -> bool:
        """Run every `nn.Linear` of the model over a packed weight in the native model's kernels
        (see `PackedLinear`), and its RMSNorms in Baton's kernel (gpu/models/kernel_rms_norms.py):
        float32 on the CPU only. Returns whether it packed."""
        weight = next(self.base.parameters())
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return False
        if not (uses_f32_kernel(weight) or onednn_linear_available()):
            return False
        run_rms_norms_in_kernel(self.base)
        for parent in [*self.base.modules(), *self.causal_lm.modules()]:
            for name, child in parent.named_children():
                if type(child) is nn.Linear and not _reads_weight(parent, name):
                    setattr(parent, name, PackedLinear(child, rows_hint))
        return True

    def streamed_weights(self) -> list[torch.Tensor]:
        """What a CPU step reads in full: the linear weights packed for Baton's float32 kernel
        (oneDNN's packed weights are opaque tensors and are left out)."""
        return [
            module.packed_weight
            for module in self.modules()
            if isinstance(module, PackedLinear) and not module.packed_weight.is_mkldnn
        ]

    def _run(
        self, step: PagedStep, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        with running_step(step):
            out = self.base(
                input_ids=input_ids.unsqueeze(0),
                position_ids=positions.unsqueeze(0).long(),
                use_cache=False,
            )
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def _probed_config(self, config: ModelConfig) -> ModelConfig:
        """`config` with the number of attention calls and the KV shape of one token's forward;
        how each call attends goes to `self.layers`."""
        device = next(self.base.parameters()).device
        one = torch.zeros(1, dtype=torch.long, device=device)
        step = PagedStep(None, None, one)
        self._run(step, one, one)
        generic_refusals.check_probe(
            config.architecture,
            step.kv_shapes,
            softcapped=step.softcapped,
            causal=step.causal,
            masked=step.masked,
        )
        num_kv_heads = step.kv_shapes[0][0]
        self.layers = step.layers
        text = self.causal_lm.config.get_text_config(decoder=True)
        return dataclasses.replace(
            config,
            hidden_size=getattr(text, "hidden_size", None) or config.hidden_size,
            num_hidden_layers=len(step.kv_shapes),
            num_attention_heads=step.num_query_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=max(max(key_size, value_size) for _, key_size, value_size in step.kv_shapes),
            # A chunked layer reads at most its last `chunk` tokens: for freeing KV blocks, a
            # window that long.
            layer_windows=[layer.window or layer.chunk for layer in step.layers],
        )


def _base_model_attribute(causal_lm: nn.Module) -> str:
    """The attribute of `causal_lm` holding its base model: `base_model_prefix`, or else its one
    child that is a transformers model (Llama 4's text CausalLM names `language_model` as its
    prefix but keeps its base at `.model`)."""
    from transformers import PreTrainedModel

    prefix = causal_lm.base_model_prefix
    if isinstance(getattr(causal_lm, prefix, None), nn.Module):
        return prefix
    models = [n for n, c in causal_lm.named_children() if isinstance(c, PreTrainedModel)]
    if len(models) != 1:
        raise UnsupportedModelError(
            f"{type(causal_lm).__name__} keeps no base model at .{prefix} nor in one child "
            "module; the generic path cannot separate its layers from its head"
        )
    return models[0]


def _called_base(causal_lm: nn.Module) -> tuple[nn.Module, str]:
    """The parent and attribute name of the module the CausalLM's forward calls for its hidden
    states: the base model (`_base_model_attribute`), or the first of its descendants that the
    CausalLM reaches into (OPT calls `model.decoder`, not `model`)."""
    prefix = _base_model_attribute(causal_lm)
    base = getattr(causal_lm, prefix)
    source = _forward_source(type(causal_lm))
    for name, _ in base.named_children():
        if f"self.{prefix}.{name}(" in source:
            return base, name
    return causal_lm, prefix


def _reads_weight(parent: nn.Module, name: str) -> bool:
    """Whether `parent`'s forward reads its linear `name`'s weight itself (LongCat's router
    multiplies by it in float32) rather than calling the layer, which a packed copy serves."""
    return f"self.{name}.weight" in _forward_source(type(parent))


@cache
def _forward_source(model_class: type) -> str:
    """The source of a transformers class's forward ("" where only bytecode is installed)."""
    try:
        return inspect.getsource(model_class.forward)
    except (OSError, TypeError):
        return ""


def load_transformers_model(
    config: ModelConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    load_format: str = "auto",
) -> TransformersCausalLM:
    """transformers' model for the checkpoint `config.path`, read from the folder alone (no
    download, no code shipped with the checkpoint), with Baton's paged attention plugged in.

    `load_format="dummy"` builds it from config.json with random weights.
    """
    import transformers
    from transformers import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        AttentionInterface,
        AutoConfig,
        AutoModelForCausalLM,
    )

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    try:
        hf_config = AutoConfig.from_pretrained(config.path, local_files_only=True)
    except ValueError as error:
        raise UnsupportedModelError(
            f"transformers {transformers.__version__} has no causal LM for {config.path} "
            f"({config.architecture}); Baton runs no code shipped with a checkpoint, so only "
            "architectures the installed transformers knows can be served",
            RefusalReason.NEEDS_REMOTE_CODE,
        ) from error
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(hf_config), None)
    if model_class is None:
        raise UnsupportedModelError(
            f"transformers {transformers.__version__} maps no causal LM class to "
            f"{type(hf_config).__name__} ({config.path}), as for the text part of a multimodal "
            "model saved alone; serve the whole model's checkpoint if it is a causal LM",
            RefusalReason.NO_CAUSAL_LM_CLASS,
        )
    generic_refusals.check_config(hf_config, model_class)
    options = dict(dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    if load_format == "dummy":
        torch.manual_seed(0)
        causal_lm = AutoModelForCausalLM.from_config(hf_config, **options)
    else:
        causal_lm = AutoModelForCausalLM.from_pretrained(
            config.path, config=hf_config, local_files_only=True, use_safetensors=True, **options
        )
    generic_refusals.check_modules(causal_lm)
    causal_lm = causal_lm.to(device).eval().requires_grad_(False)
    return TransformersCausalLM(causal_lm, config)
