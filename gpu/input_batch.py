"""Turn the scheduler's `Batch` into the packed tensors one forward pass consumes.

Runs every step, so the per-token work is done by numpy over flat arrays, not Python loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from core.batch import Batch


@dataclass(slots=True)
class AttentionMetadata:
    """Where each token's K/V goes and what each sequence attends to.

    Sequence i owns tokens `query_start_loc[i]:query_start_loc[i + 1]` of the packed batch; they
    are the last of its `seq_lens[i]` tokens. The lists serve the CPU path without device syncs;
    the tensors (int32, on the device) serve kernels.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: list[int]
    seq_lens: list[int]
    query_start_loc_tensor: torch.Tensor
    seq_lens_tensor: torch.Tensor
    max_query_len: int
    max_seq_len: int


@dataclass(slots=True)
class ModelInputs:
    """One step's forward inputs; `logits_indices` picks the rows whose next token is sampled."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor


def prepare_inputs(batch: Batch, block_size: int, device: torch.device | str) -> ModelInputs:
    """Pack `batch` (at least one sequence) into tensors on `device`."""
    seqs = batch.sequences
    num_seqs = len(seqs)
    query_lens = np.fromiter((len(s.token_ids) for s in seqs), np.int64, num_seqs)
    start_positions = np.fromiter((s.start_position for s in seqs), np.int64, num_seqs)
    query_start_loc = np.zeros(num_seqs + 1, np.int64)
    np.cumsum(query_lens, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    seq_lens = start_positions + query_lens

    input_ids = np.fromiter(chain.from_iterable(s.token_ids for s in seqs), np.int64, num_tokens)
    seq_of_token = np.repeat(np.arange(num_seqs), query_lens)
    positions = np.arange(num_tokens, dtype=np.int64) - np.repeat(
        query_start_loc[:-1] - start_positions, query_lens
    )

    block_tables = _padded_block_tables([s.block_table for s in seqs])
    block_ids = block_tables[seq_of_token, positions // block_size].astype(np.int64)
    slot_mapping = block_ids * block_size + positions % block_size

    sample = np.fromiter((s.sample for s in seqs), bool, num_seqs)
    logits_indices = query_start_loc[1:][sample] - 1

    def to_device(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(device, non_blocking=True)

    metadata = AttentionMetadata(
        slot_mapping=to_device(slot_mapping),
        block_tables=to_device(block_tables),
        query_start_loc=query_start_loc.tolist(),
        seq_lens=seq_lens.tolist(),
        query_start_loc_tensor=to_device(query_start_loc.astype(np.int32)),
        seq_lens_tensor=to_device(seq_lens.astype(np.int32)),
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()),
    )
    return ModelInputs(
        input_ids=to_device(input_ids),
        positions=to_device(positions),
        attn_metadata=metadata,
        logits_indices=to_device(logits_indices),
    )


def _padded_block_tables(tables: list[list[int]]) -> np.ndarray:
    """The block tables as one int32 [B, longest] array, short rows padded with block 0."""
    lengths = np.fromiter(map(len, tables), np.int64, len(tables))
    total = int(lengths.sum())
    flat = np.fromiter(chain.from_iterable(tables), np.int32, total)
    rows = np.repeat(np.arange(len(tables)), lengths)
    row_starts = np.cumsum(lengths) - lengths
    cols = np.arange(total) - np.repeat(row_starts, lengths)
    padded = np.zeros((len(tables), int(lengths.max(initial=1))), np.int32)
    padded[rows, cols] = flat
    return padded
