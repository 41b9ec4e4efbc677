"""Kernel dispatch: Triton on CUDA tensors, Baton's C++ kernels on float32 CPU tensors, the
plain-torch references everywhere else.

The model calls only these (its linear layers excepted: baton.kernels.linear; and the MoE experts
and logit soft-capping, plain torch on every device: baton.kernels.moe, baton.kernels.softcap). On
the CPU, attention is `paged_attention_cpu` over the step's plan, and the norms, gated activations
and rotary with the cache write are one C++ call each (kernels/csrc/layer_ops_cpu.cpp) where the
extension built; Triton is imported only once a CUDA tensor arrives. The Triton path reads only
tensors and the scalars fixed per graph bucket, never the batch's lists, and never syncs, so a CUDA
graph can capture it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Protocol

import torch

from baton.kernels.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from baton.kernels.cpu_attention_plan import CpuAttentionPlan
from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.kv_cache import write_kv_cache_ref
from baton.kernels.paged_attention import paged_attention_cpu, paged_attention_ref
from baton.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from baton.kernels.rotary import apply_rotary_ref

# Flash-decoding pays for its second kernel when the plain grid (one program per sequence and
# KV head) leaves SMs idle. A program walks its keys one tile after another, each tile waiting on
# its block-table and K/V loads, so a small batch's step waits on its longest walk: the split
# grid aims at a few programs per SM, and each sequence spreads its keys over its row of them
# (kernels/paged_attention_split_kv_triton.py). Measured on an H200 (docs/decisions.md).
SPLIT_KV_PROGRAMS_PER_SM = 4
SPLIT_KV_MIN_PARTITIONS = 8
SPLIT_KV_MIN_TOKENS = 128
# Forced Triton on CPU tensors has no GPU to ask its SM count: it decides as on an H100.
STAND_IN_NUM_SMS = 132

# None: by device; True: Triton for every tensor; False: the references for every tensor.
_forced: bool | None = None


class PackedAttentionBatch(Protocol):
    """What attention needs of a packed batch (baton.gpu.model_inputs.AttentionMetadata has it)."""

    block_tables: torch.Tensor
    query_start_loc: list[int]
    seq_lens: list[int]
    query_start_loc_tensor: torch.Tensor
    seq_lens_tensor: torch.Tensor
    max_query_len: int
    max_seq_len: int
    cpu_plan: CpuAttentionPlan | None


@cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def _forcing(value: bool) -> Iterator[None]:
    global _forced
    previous, _forced = _forced, value
    try:
        yield
    finally:
        _forced = previous


@contextmanager
def force_triton() -> Iterator[None]:
    """Within: the Triton kernels for every tensor. CPU tensors need `TRITON_INTERPRET=1` set
    before the kernel modules are imported (the jit decorator reads it)."""
    with _forcing(True):
        yield


@contextmanager
def force_reference() -> Iterator[None]:
    """Within: the plain-torch references for every tensor, CUDA ones included."""
    with _forcing(False):
        yield


def kernels_chosen_by_device() -> bool:
    """Whether each call picks its kernel by its tensors' device (nothing forced)."""
    return _forced is None


def uses_cpu_kernels(x: torch.Tensor) -> bool:
    """Whether Baton's C++ CPU kernels take `x`: float32 rows on the CPU, nothing forced."""
    # Cheapest tests first: this runs several times a layer on every step.
    return (
        _forced is None
        and x.is_cpu
        and x.dtype == torch.float32
        and x.dim() == 2
        and x.stride(-1) == 1
        and cpu_kernels_available()
    )


def uses_triton(x: torch.Tensor) -> bool:
    if _forced is not None:
        return _forced
    return x.is_cuda and triton_available()


@cache
def _cuda_num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def device_num_sms(device: torch.device) -> int:
    """The device's SM count; the H100 stand-in for CPU tensors under `force_triton()`."""
    return _cuda_num_sms(device) if device.type == "cuda" else STAND_IN_NUM_SMS


def split_kv_max_partitions(num_seqs: int, num_kv_heads: int, num_sms: int) -> int:
    """Partitions per sequence and KV head in the split-KV grid: about four programs per SM, and
    at least eight, so that a long context is not walked by a few long programs."""
    fill = -(-SPLIT_KV_PROGRAMS_PER_SM * num_sms // (num_seqs * num_kv_heads))
    return max(SPLIT_KV_MIN_PARTITIONS, fill)


def use_split_kv(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> bool:
    """Whether a decode-only batch goes to the split-KV kernel: its plain grid leaves SMs idle
    and its sequences may be long enough to split."""
    return num_seqs * num_kv_heads < num_sms and max_seq_len > SPLIT_KV_MIN_TOKENS


def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    batch: PackedAttentionBatch,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of packed queries [T, Hq, D] over one layer's paged cache; each query
    sees its last `window` tokens (itself included) when a window is given, only the tokens of
    its own `chunk`-token chunk when a chunk is given, its scores are soft-capped at `softcap`
    when one is given, and each query head's sink logit (`sinks`, [Hq], gpt-oss) joins its
    softmax's denominator when sinks are given."""
    if chunk is not None:
        # Only the reference has chunks: the generic path alone asks for them (Llama 4), and it
        # runs no CUDA graphs that the reference's per-sequence lists would break.
        tables, starts, lens = batch.block_tables, batch.query_start_loc, batch.seq_lens
        return paged_attention_ref(
            q, kv_cache, tables, starts, lens, scale, window, softcap, chunk, sinks
        )
    if not uses_triton(q):
        tables, starts, lens = batch.block_tables, batch.query_start_loc, batch.seq_lens
        # Forced references stay one SDPA call per sequence.
        if _forced is None and not q.is_cuda:
            return paged_attention_cpu(
                q, kv_cache, tables, starts, lens, scale, batch.cpu_plan, window, softcap, sinks
            )
        return paged_attention_ref(
            q, kv_cache, tables, starts, lens, scale, window, softcap, sinks=sinks
        )
    from baton.kernels.paged_attention_split_kv_triton import paged_decode_split_kv_triton
    from baton.kernels.paged_attention_triton import paged_attention_triton

    # Shapes and per-bucket scalars only: a graph replay must take the same branch.
    num_seqs = batch.seq_lens_tensor.shape[0]
    decode_only = batch.max_query_len == 1 and q.shape[0] == num_seqs
    # The split-KV kernel has no window or soft-capping (a window keeps decodes short anyway).
    plain = window is None and softcap is None
    num_kv_heads, num_sms = kv_cache.shape[3], device_num_sms(q.device)
    if plain and decode_only and use_split_kv(num_seqs, num_kv_heads, batch.max_seq_len, num_sms):
        return paged_decode_split_kv_triton(
            q,
            kv_cache,
            batch.block_tables,
            batch.seq_lens_tensor,
            batch.max_seq_len,
            scale,
            max_partitions=split_kv_max_partitions(num_seqs, num_kv_heads, num_sms),
            sinks=sinks,
        )
    return paged_attention_triton(
        q,
        kv_cache,
        batch.block_tables,
        batch.query_start_loc_tensor,
        batch.seq_lens_tensor,
        batch.max_query_len,
        scale,
        window=window,
        softcap=softcap,
        sinks=sinks,
    )


def write_kv_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    if not uses_triton(key):
        write_kv_cache_ref(key, value, kv_cache, slot_mapping)
        return
    from baton.kernels.kv_cache_triton import write_kv_cache_triton

    write_kv_cache_triton(key, value, kv_cache, slot_mapping)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, as `logits.argmax(dim=-1)` (the first index of the largest value; of
    the first NaN where a row has one), for logits [rows, vocab]: greedy sampling's token. On
    float32 CPU rows the C++ kernel, an eighth of torch's time for a 32k vocabulary."""
    if logits.shape[-1] > 0 and uses_cpu_kernels(logits):
        return torch.ops.baton_cpu.argmax_rows(logits)
    return logits.argmax(dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if uses_cpu_kernels(x):
        return torch.ops.baton_cpu.rms_norm(x, weight, eps)
    if not uses_triton(x):
        return rms_norm_ref(x, weight, eps)
    from baton.kernels.rms_norm_triton import rms_norm_triton

    return rms_norm_triton(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if uses_cpu_kernels(x) and uses_cpu_kernels(residual):
        return torch.ops.baton_cpu.fused_add_rms_norm(x, residual, weight, eps)
    if not uses_triton(x):
        return fused_add_rms_norm_ref(x, residual, weight, eps)
    from baton.kernels.rms_norm_triton import fused_add_rms_norm_triton

    return fused_add_rms_norm_triton(x, residual, weight, eps)


def rotary_and_cache_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """Rotate the queries and keys of the packed projections `qkv` [T, (Hq + 2 Hkv) D] and store
    the keys and values at their slots of the layer's cache; returns the queries [T, Hq, D]."""
    if uses_cpu_kernels(qkv) and kv_cache.is_contiguous():
        return torch.ops.baton_cpu.rotary_and_cache_kv(
            qkv, positions, cos_sin_cache, kv_cache, slot_mapping, num_heads, num_kv_heads
        )
    num_tokens, head_dim = qkv.shape[0], cos_sin_cache.shape[-1]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = apply_rotary(
        q.view(num_tokens, num_heads, head_dim),
        k.view(num_tokens, num_kv_heads, head_dim),
        positions,
        cos_sin_cache,
    )
    write_kv_cache(k, v.view(num_tokens, num_kv_heads, head_dim), kv_cache, slot_mapping)
    return q


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k): new tensors from the reference, q and k themselves from Triton."""
    if not uses_triton(q):
        return apply_rotary_ref(q, k, positions, cos_sin_cache)
    from baton.kernels.rotary_triton import apply_rotary_triton

    return apply_rotary_triton(q, k, positions, cos_sin_cache)


def gated_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The gated MLP activation a config's `hidden_act` names: [gate | up] -> act(gate) * up."""
    if name == "silu":
        return silu_and_mul
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return gelu_tanh_and_mul
    raise ValueError(f"the MLP activation {name!r} has no native kernel; use silu or gelu_tanh")


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    if uses_cpu_kernels(x):
        return torch.ops.baton_cpu.gelu_tanh_and_mul(x)
    if not uses_triton(x):
        return gelu_tanh_and_mul_ref(x)
    from baton.kernels.activation_triton import gelu_tanh_and_mul_triton

    return gelu_tanh_and_mul_triton(x)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if uses_cpu_kernels(x):
        return torch.ops.baton_cpu.silu_and_mul(x)
    if not uses_triton(x):
        return silu_and_mul_ref(x)
    from baton.kernels.activation_triton import silu_and_mul_triton

    return silu_and_mul_triton(x)
