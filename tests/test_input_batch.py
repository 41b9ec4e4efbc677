"""Packing a scheduled batch into the forward pass's tensors."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.batch import Batch, ScheduledSequence
from core.sampling_params import SamplingParams
from gpu.input_batch import prepare_inputs


def scheduled(
    token_ids: list[int], start: int, block_table: list[int], sample: bool = True
) -> ScheduledSequence:
    return ScheduledSequence(
        request_id=f"r{start}-{len(token_ids)}",
        token_ids=token_ids,
        start_position=start,
        block_table=block_table,
        sample=sample,
        sampling_params=SamplingParams(),
        all_token_ids=[0] * start + token_ids,
        num_prompt_tokens=start + len(token_ids),
    )


def test_decode_and_prefill_chunks_pack_into_positions_slots_and_block_tables() -> None:
    batch = Batch(
        [
            scheduled([7], start=5, block_table=[3, 9]),
            scheduled([1, 2, 3], start=2, block_table=[5, 0], sample=False),
            scheduled([4, 4], start=0, block_table=[8]),
        ],
        num_prefill_tokens=5,
        num_decode_tokens=1,
    )

    inputs = prepare_inputs(batch, block_size=4, device="cpu")

    metadata = inputs.attn_metadata
    assert inputs.input_ids.tolist() == [7, 1, 2, 3, 4, 4]
    assert inputs.positions.tolist() == [5, 2, 3, 4, 0, 1]
    assert metadata.slot_mapping.tolist() == [37, 22, 23, 0, 32, 33]
    assert metadata.block_tables.tolist() == [[3, 9], [5, 0], [8, 0]]
    assert metadata.query_start_loc == [0, 1, 4, 6]
    assert metadata.seq_lens == [6, 5, 2]
    assert metadata.query_start_loc_tensor.tolist() == [0, 1, 4, 6]
    assert metadata.seq_lens_tensor.tolist() == [6, 5, 2]
    assert (metadata.max_query_len, metadata.max_seq_len) == (3, 6)
    # The mid-prompt chunk samples nothing, so only the decode's and the last chunk's rows.
    assert inputs.logits_indices.tolist() == [0, 5]
    assert inputs.input_ids.dtype == inputs.positions.dtype == torch.int64
    assert metadata.slot_mapping.dtype == torch.int64
    assert metadata.block_tables.dtype == metadata.seq_lens_tensor.dtype == torch.int32


@st.composite
def batches(draw) -> tuple[Batch, int]:
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    sequences = []
    next_block = 0
    for _ in range(draw(st.integers(1, 8))):
        start = draw(st.integers(0, 40))
        token_ids = draw(st.lists(st.integers(0, 500), min_size=1, max_size=20))
        # A table may hold more blocks than this step needs.
        num_blocks = -(-(start + len(token_ids)) // block_size) + draw(st.integers(0, 2))
        table = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        sequences.append(scheduled(token_ids, start, table[::-1], draw(st.booleans())))
    return Batch(sequences, num_prefill_tokens=sum(len(s.token_ids) for s in sequences)), block_size


@settings(max_examples=60, deadline=None)
@given(batches())
def test_packed_tensors_agree_with_a_token_by_token_construction(
    batch_and_block_size: tuple[Batch, int],
) -> None:
    batch, block_size = batch_and_block_size
    input_ids, positions, slots, logits_indices = [], [], [], []
    for seq in batch.sequences:
        for offset, token_id in enumerate(seq.token_ids):
            position = seq.start_position + offset
            input_ids.append(token_id)
            positions.append(position)
            slots.append(
                seq.block_table[position // block_size] * block_size + position % block_size
            )
        if seq.sample:
            logits_indices.append(len(input_ids) - 1)

    inputs = prepare_inputs(batch, block_size, "cpu")

    assert inputs.input_ids.tolist() == input_ids
    assert inputs.positions.tolist() == positions
    assert inputs.attn_metadata.slot_mapping.tolist() == slots
    assert inputs.logits_indices.tolist() == logits_indices
    for row, seq in zip(inputs.attn_metadata.block_tables.tolist(), batch.sequences, strict=True):
        assert row[: len(seq.block_table)] == seq.block_table
        assert not any(row[len(seq.block_table) :])
