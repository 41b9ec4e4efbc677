"""How one step's packed batch splits for the CPU paged attention (`paged_attention_cpu`):
every row to the C++ kernel, or, where it cannot build or the dtype is not float32, prefill chunks
one SDPA call each and decodes batched into a few padded SDPA calls. Built once per step with the
attention metadata and read by every layer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from baton.kernels.cpu_extension import cpu_kernels_available

# Decodes are padded up to a multiple of this many tokens and run together per multiple, at
# most DECODE_GROUP sequences per SDPA call. The padded length depends only on a sequence's own
# length, so its result is the same alone and in any batch.
DECODE_BUCKET_TOKENS = 64
DECODE_GROUP = 16

# False within `plain_torch_decodes()`: the padded-SDPA path even where the C++ kernel builds.
_decode_kernel_allowed = True


@contextmanager
def plain_torch_decodes() -> Iterator[None]:
    """Within: plans send decodes to the padded-SDPA path, as where the kernel cannot build."""
    global _decode_kernel_allowed
    previous, _decode_kernel_allowed = _decode_kernel_allowed, False
    try:
        yield
    finally:
        _decode_kernel_allowed = previous


@dataclass(slots=True)
class DecodeGroup:
    """Decodes that share one gather and one SDPA call: same padded length, at most
    DECODE_GROUP of them."""

    rows: torch.Tensor  # their rows of the packed q
    blocks: torch.Tensor  # the blocks to gather, `padded_len // block_size` per sequence
    # [num_seqs, 1, 1, padded_len]: 0 for key j < seq_len, else -inf. SDPA turns a boolean
    # mask into this on every call; made once per step here.
    key_bias: torch.Tensor
    padded_len: int


@dataclass(slots=True)
class CpuAttentionPlan:
    """How one step's packed batch splits for `paged_attention_cpu`: the same for every layer,
    so the step's metadata carries one."""

    block_size: int
    dtype: torch.dtype
    # Whether the C++ kernel serves every row; else prefill chunks run one SDPA call each and
    # `decode_groups` serve the decodes.
    use_kernel: bool
    # Without the kernel: (sequence, first row, end row) of every prefill chunk.
    prefills: list[tuple[int, int, int]]
    # For the C++ kernel: each row of q it attends, that row's sequence, and how many tokens
    # the row attends to, its position + 1 (int32 or int64).
    kernel_rows: torch.Tensor
    kernel_seqs: torch.Tensor
    kernel_lens: torch.Tensor
    # For the padded-SDPA path (empty when the kernel serves the decodes), and the sequences
    # they hold, for layers whose window or soft-capping the groups' masks do not express.
    decode_groups: list[DecodeGroup]
    padded_decode_seqs: list[int]


def cpu_attention_plan(
    block_tables: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    block_size: int,
    dtype: torch.dtype,
    seq_lens_tensor: torch.Tensor | None = None,
) -> CpuAttentionPlan:
    """How `paged_attention_cpu` runs this packed batch (arguments as `paged_attention_ref`'s)
    in `dtype` over a cache of `block_size`-token blocks. `seq_lens_tensor`, `seq_lens` already
    on the CPU (int32 or int64), saves making it."""
    use_kernel = _decode_kernel_allowed and dtype == torch.float32 and cpu_kernels_available()
    if use_kernel:
        return _kernel_plan(query_start_loc, seq_lens, block_size, dtype, seq_lens_tensor)
    # Both are powers of two, so the larger is a multiple of the smaller.
    bucket_tokens = max(DECODE_BUCKET_TOKENS, block_size)
    prefills, decodes, buckets = [], [], {}
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if end - start == 1:
            decodes.append(i)
            buckets.setdefault(-(-seq_len // bucket_tokens), []).append(i)
        elif start < end:
            prefills.append((i, start, end))
    device = block_tables.device
    groups = []
    for num_chunks, bucket in buckets.items():
        padded_len = num_chunks * bucket_tokens
        width = padded_len // block_size
        for first in range(0, len(bucket), DECODE_GROUP):
            seqs = bucket[first : first + DECODE_GROUP]
            tables = block_tables[torch.tensor(seqs, device=device), :width]
            if tables.shape[1] < width:
                tables = F.pad(tables, (0, width - tables.shape[1]))
            lens = torch.tensor([seq_lens[i] for i in seqs], device=device)
            hidden = torch.arange(padded_len, device=device) >= lens[:, None]
            key_bias = torch.zeros(hidden.shape, dtype=dtype, device=device)
            key_bias.masked_fill_(hidden, float("-inf"))
            rows = torch.tensor([query_start_loc[i] for i in seqs], device=device)
            groups.append(
                DecodeGroup(rows, tables.reshape(-1), key_bias[:, None, None], padded_len)
            )
    none = _indices(0)
    return CpuAttentionPlan(
        block_size,
        dtype,
        use_kernel=False,
        prefills=prefills,
        kernel_rows=none,
        kernel_seqs=none,
        kernel_lens=none,
        decode_groups=groups,
        padded_decode_seqs=decodes,
    )


def _kernel_plan(
    query_start_loc: list[int],
    seq_lens: list[int],
    block_size: int,
    dtype: torch.dtype,
    seq_lens_tensor: torch.Tensor | None,
) -> CpuAttentionPlan:
    """Every row of the packed batch to the C++ kernel: rows are packed in sequence order, so
    they are 0..T-1, and a sequence's chunk of n rows holds its last n positions."""
    rows = _indices(query_start_loc[-1])
    if query_start_loc == list(range(len(seq_lens) + 1)):
        # Decodes only: sequence i is row i, and a row attends to its whole sequence.
        seqs = rows
        lens = seq_lens_tensor if seq_lens_tensor is not None else torch.tensor(seq_lens)
    else:
        seq_list: list[int] = []
        len_list: list[int] = []
        for i, seq_len in enumerate(seq_lens):
            query_len = query_start_loc[i + 1] - query_start_loc[i]
            seq_list += [i] * query_len
            len_list += range(seq_len - query_len + 1, seq_len + 1)
        seqs = torch.tensor(seq_list, dtype=torch.int64)
        lens = torch.tensor(len_list, dtype=torch.int64)
    return CpuAttentionPlan(
        block_size, dtype, True, [], rows, seqs, lens, decode_groups=[], padded_decode_seqs=[]
    )


class _Indices(threading.local):
    """Per thread, 0..n-1 as an int64 CPU tensor for each n asked: a view of one arange kept at
    the largest n yet, since plans only read them and making one costs more than a slice."""

    def __init__(self) -> None:
        self.indices = torch.arange(0, dtype=torch.int64)

    def take(self, n: int) -> torch.Tensor:
        if n > self.indices.numel():
            # A normal tensor, not an inference one, as `_GatherBuffer`'s.
            with torch.inference_mode(False):
                self.indices = torch.arange(max(n, 2 * self.indices.numel()), dtype=torch.int64)
        return self.indices[:n]


_indices = _Indices().take
