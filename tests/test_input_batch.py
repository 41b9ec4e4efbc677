"""Packing a scheduled batch into the forward pass's tensors."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baton.core.batch import Batch, ScheduledSequence
from baton.core.sampling_params import SamplingParams
from baton.gpu.input_batch import InputBuffers, prepare_inputs
from baton.gpu.model_inputs import ModelInputs
from baton.kernels.cpu_attention_plan import plain_torch_decodes


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
    # On the CPU the step's attention plan comes with it: the kernel takes every row, each
    # with its sequence and its own causal length (position + 1).
    plan = metadata.cpu_plan
    assert plan is not None and plan.use_kernel and plan.prefills == []
    assert plan.kernel_rows.tolist() == [0, 1, 2, 3, 4, 5]
    assert plan.kernel_seqs.tolist() == [0, 1, 1, 1, 2, 2]
    assert plan.kernel_lens.tolist() == [6, 3, 4, 5, 1, 2]
    # Without the kernel: the decode to the padded path, the two prefill chunks to SDPA.
    with plain_torch_decodes():
        plan = prepare_inputs(batch, block_size=4, device="cpu").attn_metadata.cpu_plan
    assert plan is not None and not plan.use_kernel
    assert plan.prefills == [(1, 1, 4), (2, 4, 6)]
    assert plan.padded_decode_seqs == [0]
    assert inputs.input_ids.dtype == inputs.positions.dtype == torch.int64
    assert metadata.slot_mapping.dtype == torch.int64
    assert metadata.block_tables.dtype == metadata.seq_lens_tensor.dtype == torch.int32


@st.composite
def batches(draw, block_size: int | None = None) -> tuple[Batch, int]:
    if block_size is None:
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


def assert_same_inputs(actual: ModelInputs, expected: ModelInputs) -> None:
    for name in ("input_ids", "positions", "logits_indices"):
        assert_same_tensor(getattr(actual, name), getattr(expected, name))
    got, want = actual.attn_metadata, expected.attn_metadata
    for name in ("slot_mapping", "block_tables", "query_start_loc_tensor", "seq_lens_tensor"):
        assert_same_tensor(getattr(got, name), getattr(want, name))
    assert (got.query_start_loc, got.seq_lens) == (want.query_start_loc, want.seq_lens)
    assert (got.max_query_len, got.max_seq_len) == (want.max_query_len, want.max_seq_len)


def assert_same_tensor(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert actual.tolist() == expected.tolist()


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_buffers_refilled_step_after_step_give_what_prepare_inputs_gives(data) -> None:
    block_size = data.draw(st.sampled_from([1, 2, 4, 16]))
    # Up to 8 sequences of at most 20 new tokens at positions below 60, 2 spare blocks each.
    buffers = InputBuffers(160, 8, 64 * block_size, block_size, torch.device("cpu"))
    storage = [t.data_ptr() for t in buffer_tensors(buffers)]

    for _ in range(data.draw(st.integers(1, 4))):
        batch, _ = data.draw(batches(block_size))
        expected = prepare_inputs(batch, block_size, "cpu")
        assert_same_inputs(buffers.prepare(batch), expected)

    assert [t.data_ptr() for t in buffer_tensors(buffers)] == storage


def buffer_tensors(buffers: InputBuffers) -> list[torch.Tensor]:
    return [getattr(buffers.host, f.name) for f in fields(buffers.host)]


def decodes(*seq_lens: int) -> Batch:
    """One-token steps of sequences `seq_lens` long, each in its own run of 4-token blocks."""
    sequences = [
        scheduled([100 + i], start=n - 1, block_table=[10 * i + b for b in range(-(-n // 4))])
        for i, n in enumerate(seq_lens)
    ]
    return Batch(sequences, num_decode_tokens=len(sequences))


def test_buffers_follow_tables_that_grow_change_hands_or_go_unused_at_one_width() -> None:
    buffers = InputBuffers(16, 4, max_model_len=64, block_size=4, device=torch.device("cpu"))

    def step(*tables: list[int]) -> Batch:
        sequences = [scheduled([5], 4 * len(t) - 1, t) for t in tables]
        return Batch(sequences, num_decode_tokens=len(sequences))

    a, b, c, d = [1, 2, 3], [4], [7, 8, 9], [6]
    steps = [step(a, b)]
    b.append(5)  # B crosses into a new block: its list grows in place
    steps += [step(a, b), step(c, b), step(c), step(c, d)]
    for batch in steps:
        assert_same_inputs(buffers.prepare(batch), prepare_inputs(batch, 4, "cpu"))
    c[1] = 10  # the same list, rewritten
    assert_same_inputs(buffers.prepare(step(c, d)), prepare_inputs(step(c, d), 4, "cpu"))

    padded = buffers.prepare(step(c), pad_to=3).attn_metadata.block_tables
    assert padded[:, :3].tolist() == [[7, 10, 9], [0, 0, 0], [0, 0, 0]]


def test_padded_decode_batch_ends_in_rows_that_write_nothing_and_read_block_zero() -> None:
    buffers = InputBuffers(16, 8, max_model_len=32, block_size=4, device=torch.device("cpu"))

    inputs = buffers.prepare(decodes(6, 9, 1), pad_to=5)

    metadata = inputs.attn_metadata
    assert inputs.input_ids.tolist() == [100, 101, 102, 0, 0]
    assert inputs.positions.tolist() == [5, 8, 0, 0, 0]
    assert metadata.slot_mapping.tolist() == [5, 48, 80, -1, -1]
    assert metadata.block_tables.shape == (5, 8)
    tables = [[0, 1, 0], [10, 11, 12], [20, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert metadata.block_tables[:, :3].tolist() == tables
    assert not metadata.block_tables[:, 3:].any()
    assert metadata.query_start_loc == [0, 1, 2, 3, 4, 5]
    assert metadata.seq_lens == [6, 9, 1, 1, 1]
    assert metadata.seq_lens_tensor.tolist() == [6, 9, 1, 1, 1]
    assert (metadata.max_query_len, metadata.max_seq_len) == (1, 32)
    assert inputs.logits_indices.tolist() == [0, 1, 2]


def test_a_padded_step_uses_the_same_memory_whatever_the_batch() -> None:
    buffers = InputBuffers(16, 8, max_model_len=32, block_size=4, device=torch.device("cpu"))

    def addresses(inputs: ModelInputs) -> list[tuple[int, tuple[int, ...]]]:
        metadata = inputs.attn_metadata
        tensors = [inputs.input_ids, inputs.positions, metadata.slot_mapping]
        tensors += [metadata.block_tables, metadata.query_start_loc_tensor]
        return [(t.data_ptr(), tuple(t.shape)) for t in [*tensors, metadata.seq_lens_tensor]]

    all_padding = addresses(buffers.prepare(Batch(), pad_to=4))
    buffers.prepare(Batch([scheduled([1, 2, 3], start=0, block_table=[2])], num_prefill_tokens=3))

    assert addresses(buffers.prepare(decodes(3, 7), pad_to=4)) == all_padding
    assert addresses(buffers.prepare(decodes(5, 2, 9, 4), pad_to=4)) == all_padding


def test_a_step_past_the_buffers_gets_tensors_of_its_own_and_leaves_the_buffers_alone() -> None:
    buffers = InputBuffers(4, 2, max_model_len=8, block_size=4, device=torch.device("cpu"))
    buffers.prepare(decodes(3, 6))
    before = [t.clone() for t in buffer_tensors(buffers)]
    prompt = Batch([scheduled([1] * 5, start=0, block_table=[0, 1])], num_prefill_tokens=5)
    many = decodes(1, 2, 3)

    for batch in (prompt, many):
        inputs = buffers.prepare(batch)
        assert_same_inputs(inputs, prepare_inputs(batch, 4, "cpu"))
        assert inputs.input_ids.data_ptr() != buffers.host.input_ids.data_ptr()

    assert all(
        torch.equal(t, saved) for t, saved in zip(buffer_tensors(buffers), before, strict=True)
    )


def test_batches_the_buffers_must_not_hold_are_refused() -> None:
    buffers = InputBuffers(4, 2, max_model_len=8, block_size=4, device=torch.device("cpu"))

    with pytest.raises(ValueError, match="block table of 3 blocks exceeds"):
        buffers.prepare(decodes(9), pad_to=1)
    with pytest.raises(ValueError, match="only a decode-only batch of at most 2 pads to 2"):
        buffers.prepare(Batch([scheduled([1, 2], start=0, block_table=[0])]), pad_to=2)
    with pytest.raises(ValueError, match="only a decode-only batch of at most 2 pads to 2"):
        buffers.prepare(decodes(1, 2, 3), pad_to=2)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_padded_rows_follow_the_unpadded_batch_then_the_padding_convention(data) -> None:
    block_size = data.draw(st.sampled_from([1, 4, 16]))
    buffers = InputBuffers(16, 16, 64 * block_size, block_size, torch.device("cpu"))
    batch, _ = data.draw(batches(block_size))
    for seq in batch.sequences:
        seq.start_position += len(seq.token_ids) - 1
        seq.token_ids = seq.token_ids[-1:]
    num_seqs = len(batch)
    pad_to = data.draw(st.integers(num_seqs, 16))

    expected = prepare_inputs(batch, block_size, "cpu")
    padded = buffers.prepare(batch, pad_to=pad_to)

    num_padding = pad_to - num_seqs
    got, want = padded.attn_metadata, expected.attn_metadata
    assert padded.input_ids.tolist() == expected.input_ids.tolist() + [0] * num_padding
    assert padded.positions.tolist() == expected.positions.tolist() + [0] * num_padding
    assert got.slot_mapping.tolist() == want.slot_mapping.tolist() + [-1] * num_padding
    assert got.seq_lens == got.seq_lens_tensor.tolist() == want.seq_lens + [1] * num_padding
    assert got.query_start_loc == got.query_start_loc_tensor.tolist() == list(range(pad_to + 1))
    width = want.block_tables.shape[1]
    assert got.block_tables.shape == (pad_to, buffers.max_blocks_per_seq)
    assert got.block_tables[:num_seqs, :width].tolist() == want.block_tables.tolist()
    assert not got.block_tables[:num_seqs, width:].any()
    assert not got.block_tables[num_seqs:].any()
    assert padded.logits_indices.tolist() == expected.logits_indices.tolist()
    assert (got.max_query_len, got.max_seq_len) == (1, 64 * block_size)


def test_a_padded_step_copies_only_as_many_table_columns_as_its_longest_table() -> None:
    buffers = InputBuffers(16, 8, max_model_len=32, block_size=4, device=torch.device("cpu"))
    buffers.prepare(decodes(30, 25), pad_to=2)

    tables = buffers.prepare(decodes(9, 2), pad_to=4).attn_metadata.block_tables

    # Columns 0-2 are this step's; past them, the earlier step's ids stay (nobody reads them).
    assert tables[:, :3].tolist() == [[0, 1, 2], [10, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert tables[:2, 3:].tolist() == [[3, 4, 5, 6, 7], [13, 14, 15, 16, 0]]
