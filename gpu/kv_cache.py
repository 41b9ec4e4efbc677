"""The paged KV cache tensors of every layer, and how many blocks of them fit in memory."""

from __future__ import annotations

import torch

from core.model_config import ModelConfig
from gpu.model import LayerKVCache

# The CPU serves development and CI: its cache holds max_num_seqs full-length sequences, but never
# more than this, so a large checkpoint on a laptop does not claim all of its RAM.
CPU_KV_CACHE_BYTES = 2 * 1024**3


def kv_cache_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, keys and values."""
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
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
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    kv = torch.zeros((config.num_hidden_layers, 2, *shape), dtype=dtype, device=device)
    return list(kv.unbind(0))


def cpu_num_kv_blocks(
    config: ModelConfig, max_model_len: int, max_num_seqs: int, block_size: int, dtype: torch.dtype
) -> int:
    """Blocks for `max_num_seqs` sequences of `max_model_len` tokens, up to `CPU_KV_CACHE_BYTES`."""
    blocks_per_seq = -(-max_model_len // block_size)
    affordable = CPU_KV_CACHE_BYTES // kv_cache_bytes_per_block(config, block_size, dtype)
    return max(1, min(max_num_seqs * blocks_per_seq, affordable))


def cuda_num_kv_blocks(
    config: ModelConfig,
    block_size: int,
    dtype: torch.dtype,
    gpu_memory_utilization: float,
    device: torch.device,
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
    num_blocks = int(budget // kv_cache_bytes_per_block(config, block_size, dtype))
    if num_blocks < 1:
        raise RuntimeError(
            f"no GPU memory is left for the KV cache ({budget / 2**30:.2f} GiB of "
            f"{total / 2**30:.1f} GiB after weights and activations): raise "
            "--gpu-memory-utilization, lower --max-num-batched-tokens or use a smaller model"
        )
    return num_blocks
