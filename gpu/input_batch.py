"""Turn the scheduler's `Batch` into the packed tensors one forward pass consumes.

Runs every step, so the per-token work is done by numpy over flat arrays, not Python loops.
`InputBuffers` packs into arrays allocated once per executor; `prepare_inputs` packs one batch
into fresh tensors (the profile forward, tests). On the CPU the step's attention plan is made
here too, once, for every layer to use.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from itertools import accumulate, chain

import numpy as np
import torch

from baton.core.batch import Batch, ScheduledSequence
from baton.gpu.block_table_rows import BlockTableRows
from baton.gpu.model_inputs import AttentionMetadata, ModelInputs
from baton.kernels.cpu_attention_plan import cpu_attention_plan

# Shapes whose buffer views `InputBuffers` keeps; past this many it starts over.
_MAX_CACHED_SHAPES = 64


@dataclass(slots=True)
class _Packed:
    """The sizes and host-side lists of one packed batch (`num_rows` counts padding rows)."""

    num_tokens: int
    num_rows: int
    num_logits: int
    table_width: int
    query_start_loc: list[int]
    seq_lens: list[int]
    max_query_len: int
    max_seq_len: int


@dataclass(slots=True)
class _FlatBuffers:
    """One flat tensor per packed input; the block tables are [rows * width], viewed per step."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    logits_indices: torch.Tensor

    @classmethod
    def allocate(
        cls,
        num_tokens: int,
        num_rows: int,
        table_width: int,
        device: torch.device | str,
        pin_memory: bool = False,
    ) -> _FlatBuffers:
        def zeros(size: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=device, pin_memory=pin_memory)

        return cls(
            input_ids=zeros(num_tokens, torch.int64),
            positions=zeros(num_tokens, torch.int64),
            slot_mapping=zeros(num_tokens, torch.int64),
            block_tables=zeros(num_rows * table_width, torch.int32),
            query_start_loc=zeros(num_rows + 1, torch.int32),
            seq_lens=zeros(num_rows, torch.int32),
            # A row per sampled sequence, and one more per draft token it verifies.
            logits_indices=zeros(max(num_rows, num_tokens), torch.int64),
        )

    def used(self, packed: _Packed) -> _FlatBuffers:
        """The prefix of each buffer that `packed` filled (views, no copy); the block tables
        viewed as [rows, width]."""
        return _FlatBuffers(
            input_ids=self.input_ids[: packed.num_tokens],
            positions=self.positions[: packed.num_tokens],
            slot_mapping=self.slot_mapping[: packed.num_tokens],
            block_tables=self.block_tables[: packed.num_rows * packed.table_width].view(
                packed.num_rows, packed.table_width
            ),
            query_start_loc=self.query_start_loc[: packed.num_rows + 1],
            seq_lens=self.seq_lens[: packed.num_rows],
            logits_indices=self.logits_indices[: packed.num_logits],
        )

    def copy_from(self, source: _FlatBuffers) -> None:
        """Enqueue one non-blocking copy per tensor from `source` (same sizes) into these."""
        for field in fields(self):
            getattr(self, field.name).copy_(getattr(source, field.name), non_blocking=True)


def _model_inputs(used: _FlatBuffers, packed: _Packed) -> ModelInputs:
    """ModelInputs over `used`, the buffers' views as `packed` filled them."""
    metadata = AttentionMetadata(
        slot_mapping=used.slot_mapping,
        block_tables=used.block_tables,
        query_start_loc=packed.query_start_loc,
        seq_lens=packed.seq_lens,
        query_start_loc_tensor=used.query_start_loc,
        seq_lens_tensor=used.seq_lens,
        max_query_len=packed.max_query_len,
        max_seq_len=packed.max_seq_len,
    )
    return ModelInputs(used.input_ids, used.positions, metadata, used.logits_indices)


def _numpy_views(buffers: _FlatBuffers) -> _FlatBuffers:
    """The same buffers as numpy arrays sharing their memory (CPU tensors only)."""
    return _FlatBuffers(**{f.name: getattr(buffers, f.name).numpy() for f in fields(buffers)})


def _pack(
    batch: Batch,
    block_size: int,
    out: _FlatBuffers,
    num_rows: int,
    max_table_width: int,
    tables: BlockTableRows,
) -> _Packed:
    """Write `batch` into the numpy arrays of `out`; rows past the batch's are graph padding.

    A padding row is one token at position 0 of a one-token sequence: input id 0, slot -1 (its
    K/V is not stored), an all-zero block-table row. The tables are as wide as the longest.
    What is per sequence is built in Python lists (a few dozen of them: numpy's call overhead
    would cost more), what is per token by numpy, but for decodes, whose tokens are sequences.
    """
    seqs = batch.sequences
    num_seqs = len(seqs)
    num_padding = num_rows - num_seqs
    query_lens = [len(s.token_ids) for s in seqs]
    starts = [s.start_position for s in seqs]
    query_start_loc = [0, *accumulate(query_lens)]
    num_real_tokens = query_start_loc[-1]
    num_tokens = num_real_tokens + num_padding
    query_start_loc.extend(range(num_real_tokens + 1, num_tokens + 1))
    seq_lens = [start + length for start, length in zip(starts, query_lens, strict=True)]
    seq_lens.extend([1] * num_padding)
    if num_tokens > len(out.input_ids) or num_rows > len(out.seq_lens):
        raise ValueError(
            f"a step of {num_tokens} tokens in {num_rows} sequences exceeds the input buffers "
            f"({len(out.input_ids)} tokens, {len(out.seq_lens)} sequences)"
        )
    block_tables = [s.block_table for s in seqs]
    width = max(1, max(map(len, block_tables), default=0))
    if width > max_table_width:
        raise ValueError(
            f"a block table of {width} blocks exceeds the input buffers' {max_table_width} "
            "per sequence"
        )
    table_rows = tables.write(out.block_tables, block_tables, num_rows, width)
    max_query_len = max(query_lens, default=0)
    if num_real_tokens == num_seqs and max_query_len <= 1:  # one token a sequence: decodes
        out.input_ids[:num_seqs] = [s.token_ids[0] for s in seqs]
        out.positions[:num_seqs] = starts
        out.slot_mapping[:num_seqs] = [
            table[p // block_size] * block_size + p % block_size
            for table, p in zip(block_tables, starts, strict=True)
        ]
    else:
        _pack_tokens(seqs, query_start_loc, block_size, out, table_rows)
    out.input_ids[num_real_tokens:num_tokens] = 0
    out.positions[num_real_tokens:num_tokens] = 0
    out.slot_mapping[num_real_tokens:num_tokens] = -1

    out.query_start_loc[: num_rows + 1] = query_start_loc
    out.seq_lens[:num_rows] = seq_lens
    if batch.num_draft_tokens:
        # A sequence verifying draft tokens is sampled after its last token and each draft's.
        logits_indices = [
            index
            for i, s in enumerate(seqs)
            if s.sample
            for index in range(
                query_start_loc[i + 1] - 1 - len(s.draft_token_ids), query_start_loc[i + 1]
            )
        ]
    else:
        logits_indices = [query_start_loc[i + 1] - 1 for i, s in enumerate(seqs) if s.sample]
    out.logits_indices[: len(logits_indices)] = logits_indices
    return _Packed(
        num_tokens=num_tokens,
        num_rows=num_rows,
        num_logits=len(logits_indices),
        table_width=width,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        max_query_len=max(max_query_len, 1) if num_padding else max_query_len,
        max_seq_len=max(seq_lens, default=0),
    )


def _pack_tokens(
    seqs: list[ScheduledSequence],
    query_start_loc: list[int],
    block_size: int,
    out: _FlatBuffers,
    table_rows: np.ndarray,
) -> None:
    """Input ids, positions and slots of the sequences' tokens, by numpy over all of them."""
    num_seqs = len(seqs)
    num_real_tokens = query_start_loc[num_seqs]
    starts = np.fromiter((s.start_position for s in seqs), np.int64, num_seqs)
    token_starts = np.array(query_start_loc[: num_seqs + 1], np.int64)
    query_lens = np.diff(token_starts)
    out.input_ids[:num_real_tokens] = np.fromiter(
        chain.from_iterable(s.token_ids for s in seqs), np.int64, num_real_tokens
    )
    seq_of_token = np.repeat(np.arange(num_seqs), query_lens)
    positions = np.arange(num_real_tokens, dtype=np.int64) - np.repeat(
        token_starts[:-1] - starts, query_lens
    )
    out.positions[:num_real_tokens] = positions
    block_ids = table_rows[seq_of_token, positions // block_size].astype(np.int64)
    np.add(block_ids * block_size, positions % block_size, out=out.slot_mapping[:num_real_tokens])


def prepare_inputs(
    batch: Batch,
    block_size: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
) -> ModelInputs:
    """Pack `batch` (at least one sequence) into tensors allocated for it on `device`, for a
    model running in `dtype`."""
    num_tokens = sum(len(s.token_ids) for s in batch.sequences)
    num_seqs = len(batch.sequences)
    width = max(1, max(len(s.block_table) for s in batch.sequences))
    host = _FlatBuffers.allocate(num_tokens, num_seqs, width, "cpu")
    packed = _pack(batch, block_size, _numpy_views(host), num_seqs, width, BlockTableRows())
    on_device = _FlatBuffers(
        **{f.name: getattr(host, f.name).to(device, non_blocking=True) for f in fields(host)}
    )
    return _with_cpu_plan(_model_inputs(on_device.used(packed), packed), block_size, dtype)


def _with_cpu_plan(inputs: ModelInputs, block_size: int, dtype: torch.dtype) -> ModelInputs:
    """`inputs`, on the CPU with the plan every attention layer of the step follows."""
    metadata = inputs.attn_metadata
    if metadata.block_tables.device.type == "cpu":
        metadata.cpu_plan = cpu_attention_plan(
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            block_size,
            dtype,
            metadata.seq_lens_tensor,
        )
    return inputs


class InputBuffers:
    """Packed-input buffers allocated once per executor and refilled every step.

    `prepare` packs a batch with numpy into host arrays, then on CUDA enqueues one non-blocking
    copy per tensor of the used prefix into device buffers and returns views of those; on the CPU
    the host arrays are the tensors the forward reads, with no copy at all. The views stay valid
    until the next `prepare`, which overwrites them. A step larger than the buffers (the `static`
    policy prefills whole prompts past the token budget) gets tensors of its own, as from
    `prepare_inputs`: rare, and small next to such a step's compute.

    The host arrays are pinned on CUDA, so a copy reads them after `prepare` has returned. The
    next `prepare` must not overwrite them before that copy has run: it first waits on an event
    recorded after the previous copies. A step that samples synchronizes anyway when it reads the
    tokens back, so the wait is free there; it matters for steps that sample nothing.

    Padded steps (`pad_to`, for CUDA graphs) always use the same views: `max_query_len = 1`,
    `max_seq_len = max_model_len` and block tables [pad_to, blocks for max_model_len] in a
    buffer of their own, into which the step's tables (as wide as its longest) are copied on the
    device. The columns past them keep earlier steps' block ids: kernels read only a sequence's
    own blocks, and those are valid block ids anyway. So a step copies its tables' size, not
    `max_model_len`'s.
    """

    def __init__(
        self,
        max_num_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.block_size = block_size
        self.dtype = dtype
        self.max_num_tokens = max_num_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        on_cuda = device.type == "cuda"
        sizes = (max_num_tokens, max_num_seqs, self.max_blocks_per_seq)
        self.host = _FlatBuffers.allocate(*sizes, "cpu", pin_memory=on_cuda)
        self._host_arrays = _numpy_views(self.host)
        self._table_rows = BlockTableRows()
        self._view_cache: dict[tuple[int, ...], tuple[_FlatBuffers, _FlatBuffers | None]] = {}
        self.device = _FlatBuffers.allocate(*sizes, device) if on_cuda else self.host
        self.graph_block_tables = torch.zeros(
            (max_num_seqs, self.max_blocks_per_seq), dtype=torch.int32, device=device
        )
        self._copied = torch.cuda.Event() if on_cuda else None

    def _views(self, packed: _Packed) -> tuple[_FlatBuffers, _FlatBuffers | None]:
        """The device buffers' views that `packed` fills, and on CUDA the host's to copy from.

        Kept per shape: a view costs microseconds to make, and decode steps repeat a shape
        until a sequence joins, leaves or crosses into a new block.
        """
        key = (packed.num_tokens, packed.num_rows, packed.num_logits, packed.table_width)
        views = self._view_cache.get(key)
        if views is None:
            if len(self._view_cache) >= _MAX_CACHED_SHAPES:
                self._view_cache.clear()
            # Made outside inference mode: `prepare` copies into them in and out of it.
            with torch.inference_mode(False):
                host = self.host.used(packed) if self._copied is not None else None
                views = self._view_cache[key] = (self.device.used(packed), host)
        return views

    def prepare(self, batch: Batch, pad_to: int | None = None) -> ModelInputs:
        """The forward inputs of `batch`, or of `batch` padded to `pad_to` one-token rows."""
        if self._copied is not None:
            self._copied.synchronize()
        if pad_to is not None and (
            len(batch) > pad_to or any(len(s.token_ids) != 1 for s in batch.sequences)
        ):
            raise ValueError(f"only a decode-only batch of at most {pad_to} pads to {pad_to}")
        if pad_to is None and (
            len(batch) > self.max_num_seqs
            or sum(len(s.token_ids) for s in batch.sequences) > self.max_num_tokens
        ):
            return prepare_inputs(
                batch, self.block_size, self.graph_block_tables.device, self.dtype
            )
        num_rows = len(batch) if pad_to is None else pad_to
        packed = _pack(
            batch,
            self.block_size,
            self._host_arrays,
            num_rows,
            self.max_blocks_per_seq,
            self._table_rows,
        )
        used, host_used = self._views(packed)
        if self._copied is not None and host_used is not None:
            used.copy_from(host_used)
            self._copied.record()
        inputs = _model_inputs(used, packed)
        if pad_to is not None:
            metadata = inputs.attn_metadata
            graph_tables = self.graph_block_tables[:pad_to]
            graph_tables[:, : packed.table_width].copy_(metadata.block_tables)
            metadata.block_tables = graph_tables
            metadata.max_query_len, metadata.max_seq_len = 1, self.max_model_len
        return _with_cpu_plan(inputs, self.block_size, self.dtype)
