"""Some blocks of the paged KV cache copied out as one contiguous array, and such an array copied
into other blocks: the executor's side of moving a prefilled request's KV to another engine
(core/prefilled.py). The array is raw bytes in host memory, so it crosses processes (Ray's
object store keeps a NumPy array in shared memory, read there without a copy) whatever the
cache's dtype or device."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from baton.gpu.models.model import LayerKVCache


def read_blocks(kv_caches: Sequence[LayerKVCache], block_ids: Sequence[int]) -> np.ndarray:
    """Every layer's keys and values of `block_ids`, in that order, as one uint8 array of shape
    [layers, 2, blocks, block_size, kv_heads, head_dim * dtype bytes]."""
    index = torch.tensor(list(block_ids), dtype=torch.long, device=kv_caches[0].device)
    gathered = torch.stack([layer.index_select(1, index) for layer in kv_caches])
    return gathered.cpu().view(torch.uint8).numpy()


def write_blocks(
    kv_caches: Sequence[LayerKVCache], block_ids: Sequence[int], contents: object
) -> None:
    """Copy `contents` (what `read_blocks` returned on an engine with the same model and block
    size) into `block_ids` of every layer."""
    first = kv_caches[0]
    expected = (len(kv_caches), first.shape[0], len(block_ids), *first.shape[2:-1])
    expected += (first.shape[-1] * first.element_size(),)
    if not isinstance(contents, np.ndarray) or contents.shape != expected:
        shape = getattr(contents, "shape", type(contents).__name__)
        raise ValueError(
            f"KV contents of shape {shape} do not fit {len(block_ids)} blocks of this cache "
            f"{expected}: the prefill and decode replicas must serve the same model with the "
            "same --block-size and --kv-cache-dtype"
        )
    with warnings.catch_warnings():
        # The object store hands out read-only arrays; they are only read here.
        warnings.simplefilter("ignore", UserWarning)
        source = torch.from_numpy(contents)
    source = source.view(first.dtype).to(first.device)
    index = torch.tensor(list(block_ids), dtype=torch.long, device=first.device)
    for layer, blocks in zip(kv_caches, source, strict=True):
        layer.index_copy_(1, index, blocks)
