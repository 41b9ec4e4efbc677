"""The paged KV cache tensors of every layer, and how many blocks of them fit in memory."""

from __future__ import annotations

import math
import mmap

import torch

from baton.core.checkpoint.model_config import ModelConfig
from baton.core.kv_cache.host_memory import available_memory_bytes, format_size
from baton.gpu.models.model import LayerKVCache

# Without --kv-cache-memory the CPU's cache holds max_num_seqs full-length sequences, but takes
# no more than this nor this fraction of the memory available at start-up, so a large checkpoint
# on a laptop leaves room for its weights, its activations and whatever else runs there.
CPU_KV_CACHE_BYTES = 2 * 1024**3
CPU_KV_CACHE_FRACTION = 0.25


def kv_cache_bytes_per_block(
    config: ModelConfig, block_size: int, dtype: torch.dtype, draft: ModelConfig | None = None
) -> int:
    """Bytes one block takes across all layers, keys and values; with a `draft` model, whose
    layers hold their keys and values in the same blocks (gpu/draft_runner.py), its too."""
    per_token = 0
    for layers in (config, draft):
        if layers is not None:
            per_token += 2 * layers.num_hidden_layers * layers.num_key_value_heads * layers.head_dim
    return per_token * block_size * dtype.itemsize


def allocate_kv_caches(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[LayerKVCache]:
    """Per layer one [2, num_blocks, block_size, num_kv_heads, head_dim] tensor (K, then V).

    All layers share one allocation. It is zeroed because padded kernels read slots never written:
    a masked score times a garbage NaN value would still be NaN.
    """
    shape = (config.num_hidden_layers, 2, num_blocks, block_size)
    shape += (config.num_key_value_heads, config.head_dim)
    if torch.device(device).type == "cpu":
        kv = zeroed_host_tensor(shape, dtype)
    else:
        kv = torch.zeros(shape, dtype=dtype, device=device)
    return list(kv.unbind(0))


def zeroed_host_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor in an anonymous memory mapping: the kernel maps each page to zeros on its
    first touch, so a pool of any size costs no start-up time to clear and counts in the
    process's RSS only as its blocks are first written (`torch.zeros` writes every byte)."""
    mapping = mmap.mmap(-1, math.prod(shape) * dtype.itemsize)
    # The tensor's storage keeps `mapping` alive; the mapping is page-aligned.
    return torch.frombuffer(mapping, dtype=dtype).view(shape)


def cpu_num_kv_blocks(
    config: ModelConfig,
    max_model_len: int,
    max_num_seqs: int,
    block_size: int,
    dtype: torch.dtype,
    available_bytes: int | None = None,
    draft: ModelConfig | None = None,
) -> int:
    """The default CPU cache: blocks for `max_num_seqs` sequences of `max_model_len` tokens, up
    to `CPU_KV_CACHE_BYTES` and `CPU_KV_CACHE_FRACTION` of `available_bytes` (the host's
    available memory when None), and never less than one full-length sequence."""
    per_block = kv_cache_bytes_per_block(config, block_size, dtype, draft)
    blocks_per_seq = -(-max_model_len // block_size)
    if available_bytes is None:
        available_bytes = available_memory_bytes() or CPU_KV_CACHE_BYTES
    budget = min(CPU_KV_CACHE_BYTES, int(available_bytes * CPU_KV_CACHE_FRACTION))
    return max(blocks_per_seq, min(max_num_seqs * blocks_per_seq, budget // per_block))


def budget_num_kv_blocks(
    config: ModelConfig,
    budget_bytes: int,
    max_model_len: int,
    block_size: int,
    dtype: torch.dtype,
    draft: ModelConfig | None = None,
) -> int:
    """The blocks `budget_bytes` (--kv-cache-memory) holds; refused if not one sequence of
    `max_model_len` tokens, which could then never be served."""
    per_block = kv_cache_bytes_per_block(config, block_size, dtype, draft)
    num_blocks = budget_bytes // per_block
    blocks_per_seq = -(-max_model_len // block_size)
    if num_blocks < blocks_per_seq:
        dtype_name = str(dtype).removeprefix("torch.")
        raise ValueError(
            f"--kv-cache-memory {format_size(budget_bytes)} holds {num_blocks * block_size} "
            f"tokens of KV cache, less than one sequence of --max-model-len {max_model_len} "
            f"needs ({format_size(blocks_per_seq * per_block)} in {dtype_name}); raise "
            "--kv-cache-memory or lower --max-model-len"
        )
    return num_blocks


def cuda_num_kv_blocks(
    config: ModelConfig,
    block_size: int,
    dtype: torch.dtype,
    gpu_memory_utilization: float,
    device: torch.device,
    draft: ModelConfig | None = None,
) -> int:
    """Blocks that fit in `gpu_memory_utilization` of the GPU after weights and activations.

    Call after a profile forward as large as any step, with peak statistics reset before it: its
    peak allocation stands for the weights plus the activations of the worst step.
    """
    free, total = torch.cuda.mem_get_info(device)
    # The CUDA context and other processes hold memory torch's allocator does not see.
    outside_torch = total - free - torch.cuda.memory_reserved(device)
    budget = (
        total * gpu_memory_utilization - outside_torch - torch.cuda.max_memory_allocated(device)
    )
    num_blocks = int(budget // kv_cache_bytes_per_block(config, block_size, dtype, draft))
    if num_blocks < 1:
        raise RuntimeError(
            f"no GPU memory is left for the KV cache ({budget / 2**30:.2f} GiB of "
            f"{total / 2**30:.1f} GiB after weights and activations): raise "
            "--gpu-memory-utilization, lower --max-num-batched-tokens or use a smaller model"
        )
    return num_blocks
