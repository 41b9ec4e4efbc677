"""What one forward pass consumes: the packed tokens, their positions, and where each token's K/V
goes and what each sequence attends to (gpu/input_batch.py builds them from a `Batch`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from baton.kernels.cpu_attention_plan import CpuAttentionPlan


@dataclass(slots=True)
class AttentionMetadata:
    """Where each token's K/V goes and what each sequence attends to.

    Sequence i owns tokens `query_start_loc[i]:query_start_loc[i + 1]` of the packed batch; they
    are the last of its `seq_lens[i]` tokens. The lists serve the CPU path without device syncs;
    the tensors (int32, on the device) serve kernels. `cpu_plan` is set on the CPU only.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: list[int]
    seq_lens: list[int]
    query_start_loc_tensor: torch.Tensor
    seq_lens_tensor: torch.Tensor
    max_query_len: int
    max_seq_len: int
    cpu_plan: CpuAttentionPlan | None = None


@dataclass(slots=True)
class ModelInputs:
    """One step's forward inputs; `logits_indices` picks the rows whose next token is sampled."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor
