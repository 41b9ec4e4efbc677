"""Transparent huge pages for the weights a CPU step streams.

A decode step on the CPU reads every packed linear weight once from DRAM. On 4 KiB pages that
stream takes a TLB miss every 4 KiB; on 2 MiB pages, one every 2 MiB, so the linears read
faster from huge pages (docs/decisions.md). The weights are resident anyway, so the cost is at
most the unused tail of one huge page. Linux only, where transparent huge pages are not turned
off (`always` or `madvise` in /sys/kernel/mm/transparent_hugepage/enabled); a no-op elsewhere.

The KV cache stays on normal pages: it is mapped lazily (baton.gpu.kv_cache), and on huge pages each
first write of a block would make 2 MiB of it resident instead of 4 KiB.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from pathlib import Path

import torch

from baton.core.kv_cache.host_memory import release_freed_heap

HUGE_PAGE = 2 * 1024**2
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# Tensors start on cache-line boundaries in the mapping.
ALIGN = 64
# The C heap is trimmed after every this many bytes moved: the old copies of weights packed at
# load mostly sit in the heap, which keeps freed memory resident until trimmed, and untrimmed
# the move would peak at twice the weights.
TRIM_EVERY = 32 * 1024**2


def thp_mode() -> str | None:
    """The system's transparent-huge-page mode (`always`, `madvise` or `never`), or None where
    it has none."""
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def move_to_huge_pages(tensors: Iterable[torch.Tensor]) -> int:
    """Move `tensors` (contiguous, on the CPU) side by side into one anonymous mapping advised
    for transparent huge pages, in place: each tensor's storage becomes its part of the mapping
    (`Tensor.set_`), so every holder of it reads the moved bytes, and its old memory is freed
    once nothing else holds it. Tensor objects that share their data (same start, shape and
    dtype) move once and stay shared.
    Returns the bytes moved: 0 where the system has no huge pages to give."""
    by_address: dict[int, list[torch.Tensor]] = {}
    for tensor in tensors:
        if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() == 0:
            raise ValueError("only contiguous, non-empty CPU tensors move to huge pages")
        group = by_address.setdefault(tensor.data_ptr(), [])
        if group and (group[0].shape, group[0].dtype) != (tensor.shape, tensor.dtype):
            raise ValueError("tensors that share their data move together only as one shape")
        group.append(tensor)
    if not hasattr(mmap, "MADV_HUGEPAGE") or thp_mode() not in ("always", "madvise"):
        return 0
    sizes = [-(-group[0].nbytes // ALIGN) * ALIGN for group in by_address.values()]
    total = sum(sizes)
    if total == 0:
        return 0
    # Private: a shared anonymous mapping is shared memory, whose huge pages are another
    # setting (shmem_enabled), off by default.
    mapping = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    # The tensors' storages keep `mapping` alive.
    arena = torch.frombuffer(mapping, dtype=torch.uint8)
    offset = -arena.data_ptr() % HUGE_PAGE  # the first huge-page boundary inside
    untrimmed = 0
    with torch.no_grad():
        for group, size in zip(by_address.values(), sizes, strict=True):
            first = group[0]
            moved = arena[offset : offset + first.nbytes].view(first.dtype).view(first.shape)
            moved.copy_(first)
            for tensor in group:
                tensor.set_(moved)
            offset += size
            untrimmed += size
            if untrimmed >= TRIM_EVERY:
                release_freed_heap()
                untrimmed = 0
    release_freed_heap()
    return total


def huge_page_bytes() -> int | None:
    """Bytes of this process's memory on transparent huge pages, or None where /proc does not
    say."""
    try:
        lines = Path("/proc/self/smaps_rollup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return None
