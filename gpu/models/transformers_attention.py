"""Baton's paged KV cache as an attention implementation of transformers: registered under
`ATTN_IMPLEMENTATION`, `paged_attention_forward` writes each layer's K/V into Baton's blocks by
slot mapping and attends over each sequence's own blocks with `baton.kernels.ops`.

The step's metadata reaches it through a context variable (`running_step`), because not every
model's code forwards extra keyword arguments down to attention; layers are told apart by call
order, which is the order of their caches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import nn

from baton.gpu.model_inputs import AttentionMetadata
from baton.kernels import ops

ATTN_IMPLEMENTATION = "baton_paged"


@dataclass(frozen=True, slots=True)
class LayerAttention:
    """Which keys one attention call of a forward sees besides the causal limit: its last
    `window` tokens, or the tokens of its own `chunk`-token chunk; neither: all of them."""

    window: int | None = None
    chunk: int | None = None
    # Llama 4's no-rope layers scale queries by a temperature of each token's position: its
    # (floor_scale, attn_scale), applied here because its code counts positions as one unpacked
    # sequence's.
    temperature: tuple[float, float] | None = None


@dataclass(slots=True)
class PagedStep:
    """The step a forward runs: what every attention call of it reads.

    `kv_caches=None` marks the probe at load time, which records each call's KV shape and
    attention kind instead.
    """

    metadata: AttentionMetadata | None
    kv_caches: list[torch.Tensor] | None
    positions: torch.Tensor
    layers: list[LayerAttention] = field(default_factory=list)
    num_calls: int = 0
    kv_shapes: list[tuple[int, int, int]] = field(default_factory=list)
    num_query_heads: int = 0
    softcapped: bool = False
    causal: bool = True
    masked: bool = False


_current_step: ContextVar[PagedStep | None] = ContextVar("baton_paged_step", default=None)


@contextmanager
def running_step(step: PagedStep) -> Iterator[None]:
    """Every attention call inside reads `step`."""
    token = _current_step.set(step)
    try:
        yield
    finally:
        _current_step.reset(token)


def paged_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature over Baton's paged cache.

    query [1, Hq, T, Dk], key [1, Hkv, T, Dk] and value [1, Hkv, T, Dv] hold the step's packed
    tokens; the mask is ignored because the block tables say what each token attends to
    (causally, its own sequence). Returns [1, T, Hq, Dv] as transformers' attention functions do.
    """
    step = _current_step.get()
    if step is None:
        raise RuntimeError("Baton's paged attention ran outside a TransformersCausalLM forward")
    layer = step.num_calls
    step.num_calls += 1
    num_heads, num_tokens, value_size = query.shape[1], query.shape[2], value.shape[-1]
    if step.kv_caches is None:
        step.kv_shapes.append((key.shape[1], key.shape[-1], value.shape[-1]))
        step.num_query_heads = num_heads
        step.layers.append(_layer_attention(module, kwargs.get("sliding_window")))
        step.softcapped |= kwargs.get("softcap") is not None
        step.causal &= bool(kwargs.get("is_causal", getattr(module, "is_causal", True)))
        step.masked |= attention_mask is not None
        return query.new_zeros(1, num_tokens, num_heads, value_size), None
    kind = step.layers[layer]
    if kind.temperature is not None:
        # transformers' own expression, over the packed tokens' true positions.
        floor_scale, attn_scale = kind.temperature
        scales = torch.log1p(torch.floor((step.positions.float() + 1.0) / floor_scale))
        query = (query * (scales * attn_scale + 1.0).view(1, 1, -1, 1)).to(query.dtype)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    # Keys and values of any size (multi-head latent attention's differ, as do Gemma 4's global
    # and sliding layers') fill the cache's one head size: zero channels change no score, and
    # over zero-padded values the output's first value-size channels are attention's own.
    kv_cache = step.kv_caches[layer]
    cache_size = kv_cache.shape[-1]
    # The attention kernel reads each query token's heads as one block; the cache writes read
    # keys and values through their strides.
    q = _padded(query[0].transpose(0, 1), cache_size).contiguous()
    k = _padded(key[0].transpose(0, 1), cache_size)
    v = _padded(value[0].transpose(0, 1), cache_size)
    ops.write_kv_cache(k, v, kv_cache, step.metadata.slot_mapping)
    # gpt-oss-style sinks reach attention as `s_aux`, one logit per query head.
    out = ops.paged_attention(
        q,
        kv_cache,
        step.metadata,
        scale,
        window=kind.window,
        chunk=kind.chunk,
        sinks=kwargs.get("s_aux"),
    )
    return out[..., :value_size].unsqueeze(0), None


def _padded(heads: torch.Tensor, size: int) -> torch.Tensor:
    """`heads` [T, H, D] with zero channels appended up to `size`, each head's channels
    adjacent."""
    if heads.shape[-1] == size:
        return heads if heads.stride(-1) == 1 else heads.contiguous()
    padded = heads.new_zeros(*heads.shape[:-1], size)
    padded[..., : heads.shape[-1]] = heads
    return padded


def _layer_attention(module: nn.Module, sliding_window: int | None) -> LayerAttention:
    """What the attention call of `module` sees: the window transformers hands attention (as it
    does for flash attention, which takes no mask), else what the config's `layer_types` says
    of the layer, the only place Llama 4's chunked layers are named. A query temperature of
    Llama 4's is taken over: turned off in the module, applied by `paged_attention_forward`."""
    config = getattr(module, "config", None)
    layer_types = getattr(config, "layer_types", None)
    layer_idx = getattr(module, "layer_idx", None)
    layer_type = None
    if layer_types and isinstance(layer_idx, int) and layer_idx < len(layer_types):
        layer_type = layer_types[layer_idx]
    if sliding_window is None and layer_type == "sliding_attention":
        sliding_window = config.sliding_window
    chunk = config.attention_chunk_size if layer_type == "chunked_attention" else None
    temperature = None
    if getattr(module, "attn_temperature_tuning", False) and not getattr(module, "use_rope", True):
        temperature = (float(module.floor_scale), float(module.attn_scale))
        module.attn_temperature_tuning = False
    return LayerAttention(window=sliding_window, chunk=chunk, temperature=temperature)
