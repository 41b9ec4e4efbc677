"""The decoder-only transformer of Baton's native families, over a packed batch.

Llama is the base; the config's switches add what other families change: q/k norm (Qwen3,
Gemma 3), Gemma's norms after attention and around the MLP, scaled embeddings, GeGLU and logit
soft-capping, per-layer sliding windows (Mistral, Gemma, gpt-oss), attention sinks (gpt-oss),
and mixture-of-experts MLPs (gpu/models/moe.py: Mixtral, Qwen3-MoE; gpu/models/gpt_oss.py).

Every scheduled token of every sequence runs as one [T, hidden] tensor. Each attention layer
writes its new K/V into the paged cache by slot mapping and then reads all K/V back from the
cache, so the cache is the only source of keys and values. Every kernel comes from
`baton.kernels.ops`: Triton on CUDA tensors, the plain-torch references on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from baton.core.checkpoint.model_config import ModelConfig
from baton.gpu.model_inputs import AttentionMetadata
from baton.gpu.models.gpt_oss import GptOssMoE
from baton.gpu.models.moe import SparseMoE
from baton.kernels import ops
from baton.kernels.f32_linear import (
    f32_gated_linear,
    f32_kernel_available,
    f32_linear,
    pack_gated_weight,
    pack_weight,
)
from baton.kernels.linear import (
    cpu_has_native_bf16,
    onednn_linear,
    onednn_linear_available,
    pack_linear_weight,
)
from baton.kernels.rotary import build_cos_sin_cache
from baton.kernels.softcap import softcap_ref

# One layer's keys and values: [2, num_blocks, block_size, num_kv_heads, head_dim].
LayerKVCache = torch.Tensor


def uses_f32_kernel(weight: torch.Tensor) -> bool:
    """Whether a packed CPU weight runs in Baton's float32 kernel (baton.kernels.f32_linear) rather
    than oneDNN: float32, where the C++ kernels built with the kernel's vector code."""
    return weight.dtype == torch.float32 and f32_kernel_available()


def pack_cpu_weight(weight: torch.Tensor, rows_hint: int) -> torch.Tensor:
    """`weight` [out, in] in the layout its CPU kernel reads: Baton's float32 kernel's, else
    oneDNN's (bfloat16, or no C++ kernels)."""
    if uses_f32_kernel(weight):
        return pack_weight(weight)
    return pack_linear_weight(weight, rows_hint)


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """`F.linear` over a weight `pack_cpu_weight` packed."""
    if packed.is_mkldnn:
        return onednn_linear(x, packed, bias)
    return f32_linear(x, packed, bias, out_features)


class Linear(nn.Linear):
    """`nn.Linear` that can run over a packed copy of its weight on the CPU: in Baton's float32
    kernel (baton.kernels.f32_linear), or oneDNN's layout (baton.kernels.linear) for bfloat16.

    Once packed, the float weight is dropped (left as a meta tensor of the same shape, so the
    parameter count stands): the packed copy is the only one, not a second one in memory.
    """

    packed_weight: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is None:
            return F.linear(x, self.weight, self.bias)
        return packed_linear(x, self.packed_weight, self.bias, self.out_features)

    def pack(self, rows_hint: int) -> None:
        """Pack the weight for its CPU kernel, unless it is packed already (MLP.pack packs its
        gate_up projection in a layout of its own)."""
        if self.packed_weight is None:
            self.pack_as(pack_cpu_weight(self.weight, rows_hint))

    def pack_as(self, packed: torch.Tensor) -> None:
        """Run over `packed`, a packed copy of the weight, and drop the float weight."""
        self.packed_weight = packed
        self.weight = nn.Parameter(self.weight.to("meta"), requires_grad=False)


class Embedding(nn.Embedding):
    """`nn.Embedding` without random initial weights: the table always comes from the checkpoint
    (or baton.gpu.loader's dummy weights), and drawing it on the meta device would import torch's
    compiler, and Triton with it, only to throw the draw away."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add `x` to the residual stream and normalize: (normed, new_residual)."""
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions, through the paged KV cache."""

    def __init__(self, config: ModelConfig, layer: int, cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = config.attention_scale or self.head_dim**-0.5
        self.window = config.layer_window(layer)
        self.softcap = config.attn_logit_softcap
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_proj_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.sinks = nn.Parameter(torch.empty(self.num_heads)) if config.attention_sinks else None
        # Shared by all layers and kept in float32: not a parameter, so never cast or reloaded.
        self.cos_sin_cache = cos_sin_cache

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        kv_cache: LayerKVCache,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        if self.q_norm is None or self.k_norm is None:
            q = ops.rotary_and_cache_kv(
                qkv,
                positions,
                self.cos_sin_cache,
                kv_cache,
                attn_metadata.slot_mapping,
                self.num_heads,
                self.num_kv_heads,
            )
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))
            # Triton rotates q and k in place: strided views into the qkv output are fine.
            q, k = ops.apply_rotary(q, k, positions, self.cos_sin_cache)
            v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
            ops.write_kv_cache(k, v, kv_cache, attn_metadata.slot_mapping)
        out = ops.paged_attention(
            q,
            kv_cache,
            attn_metadata,
            self.scale,
            window=self.window,
            softcap=self.softcap,
            sinks=self.sinks,
        )
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class MLP(nn.Module):
    """Gated feed-forward (SwiGLU, or GeGLU for Gemma) with the gate and up projections fused
    into one matmul. Where Baton's float32 kernel runs that matmul, its weight is packed with
    the gate and up channels side by side and the kernel applies the gate itself
    (baton.kernels.f32_linear.f32_gated_linear): the [gate | up] outputs are then never written out
    and read back, and `gate_up_proj` alone no longer gives them."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_and_mul = ops.gated_activation(config.hidden_act)
        # The gate `act_and_mul` applies, as f32_gated_linear and the decoder-layers op name it.
        self.gelu = self.act_and_mul is ops.gelu_tanh_and_mul
        self.gated_in_kernel = False

    def pack(self, rows_hint: int) -> None:
        """Where Baton's float32 kernel will run the gate_up projection, pack it for
        `f32_gated_linear` (its Linear.pack then keeps that layout)."""
        gate_up = self.gate_up_proj
        # An int8 gate_up (baton.gpu.models.quantization) is no Linear; a packed one keeps its
        # layout.
        if (
            isinstance(gate_up, Linear)
            and gate_up.packed_weight is None
            and uses_f32_kernel(gate_up.weight)
        ):
            gate_up.pack_as(pack_gated_weight(gate_up.weight))
            self.gated_in_kernel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated_in_kernel:
            packed = self.gate_up_proj.packed_weight
            return self.down_proj(f32_gated_linear(x, packed, self.intermediate_size, self.gelu))
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    """Pre-norm block: norm, attention, residual add; norm, MLP, residual add. Gemma also norms
    the attention's and the MLP's outputs before each add (its `post_attention_layernorm` is
    that output norm, and `pre_feedforward_layernorm` the MLP's input norm).

    Each residual add is deferred into the next norm (fused add + RMSNorm), so a layer returns
    its output and the residual stream separately.
    """

    def __init__(self, config: ModelConfig, layer: int, cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(size, eps)
        self.self_attn = Attention(config, layer, cos_sin_cache)
        self.post_attention_layernorm = RMSNorm(size, eps)
        self.pre_feedforward_layernorm = RMSNorm(size, eps) if config.gemma else None
        self.post_feedforward_layernorm = RMSNorm(size, eps) if config.gemma else None
        self.mlp = feed_forward(config, layer)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: LayerKVCache,
        attn_metadata: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, attn_metadata)
        if self.pre_feedforward_layernorm is None or self.post_feedforward_layernorm is None:
            hidden, residual = self.post_attention_layernorm.add_and_norm(hidden, residual)
            return self.mlp(hidden), residual
        hidden = self.post_attention_layernorm(hidden)
        hidden, residual = self.pre_feedforward_layernorm.add_and_norm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


def feed_forward(config: ModelConfig, layer: int) -> nn.Module:
    """Layer `layer`'s MLP: dense, or the experts of the config's MoE layout."""
    if not config.is_moe_layer(layer):
        return MLP(config)
    return GptOssMoE(config) if config.moe == "gpt_oss" else SparseMoE(config)


class CausalLM(nn.Module):
    """Token embeddings, the decoder layers, a final norm and the LM head.

    `tie_word_embeddings` overrides the config's flag (the loader ties when a checkpoint has no
    `lm_head.weight`). The rotary cache covers positions `0 .. max_positions - 1` and is built on
    `device` even when the layers are built on the meta device.
    """

    def __init__(
        self,
        config: ModelConfig,
        max_positions: int | None = None,
        device: torch.device | str = "cpu",
        tie_word_embeddings: bool | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        num_positions = max_positions or config.max_position_embeddings
        cos_sin_cache = build_cos_sin_cache(config.rope, config.head_dim, num_positions, device)
        local_cache = cos_sin_cache
        if config.local_rope is not None:
            local_cache = build_cos_sin_cache(
                config.local_rope, config.head_dim, num_positions, device
            )
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        # Gemma scales embeddings by sqrt(hidden), rounded to the model's dtype as it does.
        self.embed_scale = config.hidden_size**0.5 if config.gemma else None
        self.layers = nn.ModuleList(
            DecoderLayer(
                config, i, local_cache if config.layer_window(i) is not None else cos_sin_cache
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if tie_word_embeddings is None:
            tie_word_embeddings = config.tie_word_embeddings
        self.packed_logits_weight: torch.Tensor | None = None
        # A Linear, or baton.gpu.models.quantization's Int8Linear (also for tied embeddings) once
        # quantized.
        self.lm_head: nn.Module | None = (
            None
            if tie_word_embeddings
            else Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata,
        kv_caches: list[LayerKVCache],
    ) -> torch.Tensor:
        """The final hidden state of every packed token: [T, hidden_size]."""
        hidden = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, attn_metadata)
        hidden, _ = self.norm.add_and_norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits [N, vocab_size] for the hidden states [N, hidden_size] given."""
        if self.lm_head is not None:
            logits = self.lm_head(hidden)
        elif self.packed_logits_weight is not None:
            logits = packed_linear(
                hidden, self.packed_logits_weight, None, self.embed_tokens.num_embeddings
            )
        else:
            logits = F.linear(hidden, self.embed_tokens.weight)
        if self.config.final_logit_softcap is not None:
            logits = softcap_ref(logits, self.config.final_logit_softcap)
        return logits

    @property
    def graph_capturable(self) -> bool:
        """Whether decode steps may be captured in CUDA graphs. Not MoE models: the experts'
        split by token count is decided on the host. Not windowed or soft-capped ones either,
        until their Triton attention has run under graph capture on a GPU (it has been checked
        against the reference in the interpreter only)."""
        config = self.config
        windowed = any(config.layer_window(i) for i in range(config.num_hidden_layers))
        return not (windowed or config.attn_logit_softcap or config.moe)

    def pack_linear_weights(self, rows_hint: int) -> bool:
        """Run every linear layer over packed weights on the CPU: in float32 through Baton's
        kernel (baton.kernels.f32_linear), in bfloat16 where the CPU multiplies it natively through
        oneDNN (baton.kernels.linear), as the float MoE experts in both. Tied embeddings keep their
        table for lookups and get a packed copy for the LM head. Returns whether it packed; the
        weights are loaded by then."""
        embed = self.embed_tokens.weight
        if embed.device.type != "cpu" or not onednn_linear_available():
            return False
        native_bf16 = embed.dtype == torch.bfloat16 and cpu_has_native_bf16()
        if embed.dtype != torch.float32 and not native_bf16:
            return False
        for module in self.modules():
            if isinstance(module, (MLP, Linear, SparseMoE, GptOssMoE)):
                module.pack(rows_hint)
        if self.lm_head is None:
            self.packed_logits_weight = pack_cpu_weight(embed, rows_hint)
        return True
