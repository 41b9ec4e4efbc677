"""The CPU path's paged attention against the reference and against itself alone: same
attention, and a decode's result does not depend on its company. Every test runs both decode
paths: the C++ kernel (kernels/csrc) and the padded SDPA calls by length bucket that machines
without a compiler run."""

from __future__ import annotations

import random

import pytest
import torch

from baton.kernels.cpu_attention_plan import DECODE_GROUP, cpu_attention_plan, plain_torch_decodes
from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.paged_attention import paged_attention_cpu, paged_attention_ref

HEAD_DIM = 32


@pytest.fixture(autouse=True, params=["kernel", "plain-torch"])
def decode_path(request):
    if request.param == "kernel":
        # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
        assert cpu_kernels_available()
        yield request.param
    else:
        with plain_torch_decodes():
            yield request.param


def packed_batch(
    sequences: list[tuple[int, int]],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    seed: int,
    head_dim: int = HEAD_DIM,
):
    """Random K/V cached for each (seq_len, query_len) in shuffled blocks, and packed queries.

    Block tables are padded with block 0 to the longest sequence, as the packed batch pads them.
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    num_blocks = sum(-(-seq_len // block_size) for seq_len, _ in sequences) + 3
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim)
    free_blocks = list(range(num_blocks))
    rng.shuffle(free_blocks)
    max_blocks = max(-(-seq_len // block_size) for seq_len, _ in sequences)
    block_tables = torch.zeros(len(sequences), max_blocks, dtype=torch.int32)
    for i, (seq_len, _) in enumerate(sequences):
        table = [free_blocks.pop() for _ in range(-(-seq_len // block_size))]
        block_tables[i, : len(table)] = torch.tensor(table)
    query_start_loc = [0]
    for _, query_len in sequences:
        query_start_loc.append(query_start_loc[-1] + query_len)
    q = torch.randn(query_start_loc[-1], num_heads, head_dim)
    seq_lens = [seq_len for seq_len, _ in sequences]
    return q, kv_cache, block_tables, query_start_loc, seq_lens


# Decodes on and off block and bucket edges (64 tokens), some longer than the table width lets
# a short bucket read, a 1-token sequence, prefill chunks in between, and an empty slot.
MIXED = [(1, 1), (37, 1), (64, 1), (65, 1), (40, 7), (128, 1), (9, 1), (50, 18), (70, 0), (200, 1)]


@pytest.mark.parametrize("block_size", [4, 16, 128])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (8, 1)])
def test_cpu_path_matches_reference_on_a_mixed_packed_batch(
    block_size: int, num_heads: int, num_kv_heads: int
) -> None:
    batch = packed_batch(MIXED, block_size, num_heads, num_kv_heads, seed=block_size + num_heads)
    expected = paged_attention_ref(*batch, scale=HEAD_DIM**-0.5)
    actual = paged_attention_cpu(*batch, scale=HEAD_DIM**-0.5)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_decode_output_is_bitwise_the_same_alone_and_in_a_batch() -> None:
    # More same-bucket decodes than one SDPA call takes, so the tracked one shares a group.
    rng = random.Random(0)
    others = [(rng.randint(1, 300), 1) for _ in range(3 * DECODE_GROUP)]
    tracked = (100, 1)
    q, kv_cache, block_tables, query_start_loc, seq_lens = packed_batch(
        [*others, tracked, (30, 12)], 16, 8, 2, seed=1
    )
    batched = paged_attention_cpu(q, kv_cache, block_tables, query_start_loc, seq_lens, 0.2)
    row = query_start_loc[len(others)]
    alone = paged_attention_cpu(
        q[row : row + 1], kv_cache, block_tables[len(others) :][:1], [0, 1], [tracked[0]], 0.2
    )
    assert torch.equal(batched[row : row + 1], alone)


def test_a_prompts_rows_have_the_same_bits_in_one_chunk_in_chunks_and_one_by_one(
    decode_path: str,
) -> None:
    # The kernel attends each row on its own: bit for bit the same however the prompt is cut.
    # The padded-SDPA path's prefill chunks depend on their length, so there only up to rounding.
    def same(actual: torch.Tensor, expected: torch.Tensor) -> None:
        if decode_path == "kernel":
            assert torch.equal(actual, expected)
        else:
            torch.testing.assert_close(actual, expected)

    # A 90-token prompt whose K/V is all cached: its rows attended as one chunk, as chunks of
    # 7 beside another sequence's decode, and one at a time as decodes.
    q, kv_cache, block_tables, _, _ = packed_batch([(90, 90), (50, 1)], 16, 8, 2, seed=11)
    whole = paged_attention_cpu(q[:90], kv_cache, block_tables[:1], [0, 90], [90], 0.2)
    for first in range(0, 90, 7):
        end = min(90, first + 7)
        rows = torch.cat([q[first:end], q[90:]])
        chunk = paged_attention_cpu(
            rows, kv_cache, block_tables, [0, end - first, end - first + 1], [end, 50], 0.2
        )
        same(chunk[: end - first], whole[first:end])
    for position in (0, 45, 89):
        one = paged_attention_cpu(
            q[position : position + 1], kv_cache, block_tables[:1], [0, 1], [position + 1], 0.2
        )
        same(one, whole[position : position + 1])


def test_cpu_path_runs_in_and_out_of_inference_mode_alike() -> None:
    # Longer than any other test's decodes, so the gather buffer is made inside inference mode.
    batch = packed_batch([(2000, 1)] * 4, 16, 4, 2, seed=3)
    expected = paged_attention_ref(*batch, scale=0.25)
    with torch.inference_mode():
        inside = paged_attention_cpu(*batch, scale=0.25)
    torch.testing.assert_close(paged_attention_cpu(*batch, scale=0.25), expected)
    torch.testing.assert_close(inside, expected)


def test_a_block_table_refilled_in_place_is_not_served_a_stale_plan() -> None:
    # Same lengths and the same table tensor with other blocks, as when a step refills
    # persistent input buffers: nothing made for the old blocks may be reused.
    batch = packed_batch([(40, 1), (40, 1), (9, 3)], 16, 4, 2, seed=5)
    block_tables = batch[2]
    before = paged_attention_cpu(*batch, scale=0.25)
    block_tables[:2] = block_tables[:2].flip(0).clone()
    after = paged_attention_cpu(*batch, scale=0.25)
    torch.testing.assert_close(after, paged_attention_ref(*batch, scale=0.25))
    assert not torch.allclose(after[:2], before[:2])


def test_a_plan_made_once_serves_every_layer_as_a_plan_per_call_would() -> None:
    q, kv_cache, block_tables, query_start_loc, seq_lens = packed_batch(MIXED, 16, 8, 2, seed=4)
    plan = cpu_attention_plan(block_tables, query_start_loc, seq_lens, 16, torch.float32)
    for layer in range(3):
        layer_cache = kv_cache * (layer + 1)
        batch = (q, layer_cache, block_tables, query_start_loc, seq_lens)
        planned = paged_attention_cpu(*batch, scale=0.25, plan=plan)
        assert torch.equal(planned, paged_attention_cpu(*batch, scale=0.25))


def test_a_decode_only_plan_reads_row_i_as_sequence_i_with_the_lengths_given() -> None:
    q, kv_cache, block_tables, query_start_loc, seq_lens = packed_batch(
        [(40, 1), (9, 1), (130, 1)], 16, 4, 2, seed=7
    )
    lengths = torch.tensor(seq_lens, dtype=torch.int32)

    plan = cpu_attention_plan(block_tables, query_start_loc, seq_lens, 16, torch.float32, lengths)

    if plan.use_kernel:
        assert plan.kernel_rows.tolist() == plan.kernel_seqs.tolist() == [0, 1, 2]
        assert plan.kernel_lens is lengths
    else:
        assert plan.padded_decode_seqs == [0, 1, 2]
    batch = (q, kv_cache, block_tables, query_start_loc, seq_lens)
    torch.testing.assert_close(
        paged_attention_cpu(*batch, scale=0.25, plan=plan), paged_attention_ref(*batch, scale=0.25)
    )


def test_a_plan_for_another_dtype_is_refused_with_what_to_change() -> None:
    q, kv_cache, block_tables, query_start_loc, seq_lens = packed_batch(MIXED, 16, 4, 2, seed=6)
    plan = cpu_attention_plan(block_tables, query_start_loc, seq_lens, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="build the step's inputs with the model's dtype"):
        paged_attention_cpu(q, kv_cache, block_tables, query_start_loc, seq_lens, 0.25, plan)


@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_real_head_sizes_and_int64_tables_match_reference(head_dim: int) -> None:
    q, kv_cache, block_tables, query_start_loc, seq_lens = packed_batch(
        [(300, 1), (17, 1), (64, 5), (513, 1)], 16, 8, 2, seed=head_dim, head_dim=head_dim
    )
    batch = (q, kv_cache, block_tables.long(), query_start_loc, seq_lens)
    torch.testing.assert_close(
        paged_attention_cpu(*batch, scale=head_dim**-0.5),
        paged_attention_ref(*batch, scale=head_dim**-0.5),
        atol=1e-5,
        rtol=1e-5,
    )


def test_sharp_scores_late_in_a_sequence_stay_exact() -> None:
    # Scores span hundreds: the running maximum of the online softmax jumps in a late block,
    # so everything accumulated before must be rescaled, not overflow or vanish.
    q, kv_cache, block_tables, query_start_loc, seq_lens = packed_batch(
        [(200, 1), (33, 1)], 16, 4, 4, seed=9
    )
    kv_cache[0, block_tables[0, 11]] *= 40.0
    batch = (q * 10.0, kv_cache, block_tables, query_start_loc, seq_lens)
    expected = paged_attention_ref(*batch, scale=HEAD_DIM**-0.5)
    actual = paged_attention_cpu(*batch, scale=HEAD_DIM**-0.5)
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


def test_kernel_refuses_a_length_past_its_block_table_with_a_clear_error() -> None:
    assert cpu_kernels_available()
    q, kv_cache, block_tables, _, seq_lens = packed_batch([(40, 1), (20, 1)], 16, 4, 2, seed=2)
    out = torch.empty_like(q)
    rows = torch.tensor([0, 1])
    with pytest.raises(RuntimeError, match="past its block table"):
        torch.ops.baton_cpu.paged_attention(
            out, q, kv_cache, block_tables, torch.tensor([40, 49]), rows, rows, 0.25
        )
    with pytest.raises(RuntimeError, match="one length a row"):
        torch.ops.baton_cpu.paged_attention(
            out, q, kv_cache, block_tables, torch.tensor([40]), rows, rows, 0.25
        )
    for bad_id in (kv_cache.shape[1], -1):
        block_tables[1, 0] = bad_id
        with pytest.raises(RuntimeError, match="outside the cache"):
            torch.ops.baton_cpu.paged_attention(
                out, q, kv_cache, block_tables, torch.tensor(seq_lens), rows, rows, 0.25
            )


def dense_attention(
    q, kv_cache, block_tables, query_start_loc, seq_lens, scale, window, softcap, sinks=None
):
    """The definition, one query at a time over each sequence's keys laid out contiguously:
    key j is seen from position p when j <= p and (no window or j > p - window); a head's sink
    adds exp(sink) to its softmax's denominator."""
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    out = torch.zeros_like(q)
    for i, seq_len in enumerate(seq_lens):
        blocks = block_tables[i, : -(-seq_len // block_size)].long()
        keys = kv_cache[0, blocks].reshape(-1, num_kv_heads, q.shape[2])[:seq_len]
        values = kv_cache[1, blocks].reshape(-1, num_kv_heads, q.shape[2])[:seq_len]
        group = q.shape[1] // num_kv_heads
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        start, end = query_start_loc[i], query_start_loc[i + 1]
        for row in range(start, end):
            position = seq_len - (end - row)
            first = 0 if window is None else max(0, position - window + 1)
            scores = torch.einsum("hd,khd->hk", q[row], keys[first : position + 1]) * scale
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            weights = scores.softmax(-1)
            if sinks is not None:
                weights = scores.exp() / (scores.exp().sum(-1, keepdim=True) + sinks.exp()[:, None])
            out[row] = torch.einsum("hk,khd->hd", weights, values[first : position + 1])
    return out


@pytest.mark.parametrize(("window", "softcap"), [(5, None), (16, None), (40, 2.0), (None, 2.0)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_window_and_softcap_match_their_definition(window, softcap, block_size) -> None:
    batch = packed_batch(MIXED, block_size, 8, 2, seed=11)
    expected = dense_attention(*batch, HEAD_DIM**-0.5, window, softcap)
    reference = paged_attention_ref(*batch, HEAD_DIM**-0.5, window, softcap)
    actual = paged_attention_cpu(*batch, HEAD_DIM**-0.5, None, window, softcap)
    torch.testing.assert_close(reference, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_a_window_reads_no_block_behind_it() -> None:
    # Blocks wholly behind every query's window hold NaN, as freed and reused blocks might hold
    # anything: neither path may read them.
    batch = packed_batch([(100, 1), (70, 6)], 16, 4, 2, seed=12)
    kv_cache, block_tables = batch[1], batch[2]
    expected = paged_attention_ref(*batch, 0.25, 20)
    kv_cache[:, block_tables[0, :4].long()] = float("nan")
    kv_cache[:, block_tables[1, :2].long()] = float("nan")
    torch.testing.assert_close(paged_attention_ref(*batch, 0.25, 20), expected)
    torch.testing.assert_close(paged_attention_cpu(*batch, 0.25, None, 20), expected)


# Sinks from far below every score (no effect) to far above (most of the weight), per head.
SINKS = torch.tensor([-30.0, -1.0, 0.0, 0.5, 2.0, 4.0, 8.0, 30.0])


@pytest.mark.parametrize(
    ("window", "softcap", "block_size", "num_kv_heads", "head_dim"),
    [(None, None, 4, 2, 32), (5, None, 16, 8, 32), (16, 2.0, 16, 1, 20), (None, None, 16, 1, 20)],
)
def test_sinks_match_their_definition_with_windows_and_gqa(
    window, softcap, block_size, num_kv_heads, head_dim
) -> None:
    # A head_dim that is no multiple of 8 runs the kernel's plain loops, not its vector code.
    batch = packed_batch(MIXED, block_size, 8, num_kv_heads, seed=13, head_dim=head_dim)
    expected = dense_attention(*batch, HEAD_DIM**-0.5, window, softcap, sinks=SINKS)
    reference = paged_attention_ref(*batch, HEAD_DIM**-0.5, window, softcap, sinks=SINKS)
    actual = paged_attention_cpu(*batch, HEAD_DIM**-0.5, None, window, softcap, SINKS)
    torch.testing.assert_close(reference, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_sinks_far_above_every_score_stay_finite() -> None:
    # A sink beyond exp's float range against small scores: the sink must not be exponentiated
    # against the scores' maximum alone.
    batch = packed_batch([(40, 1), (9, 4)], 16, 4, 2, seed=14)
    sinks = torch.tensor([200.0, 100.0, -200.0, 0.0])
    q, kv_cache, *rest = batch
    expected = dense_attention(q.double(), kv_cache.double(), *rest, 0.25, None, None, sinks)
    actual = paged_attention_cpu(*batch, 0.25, None, None, None, sinks)
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual, expected.float(), atol=1e-6, rtol=1e-5)


def test_a_sink_per_head_of_the_wrong_size_is_refused() -> None:
    assert cpu_kernels_available()
    q, kv_cache, block_tables, _, seq_lens = packed_batch([(40, 1)], 16, 4, 2, seed=2)
    rows = torch.tensor([0])
    with pytest.raises(RuntimeError, match="one logit per query head"):
        torch.ops.baton_cpu.paged_attention(
            torch.empty_like(q),
            q,
            kv_cache,
            block_tables,
            torch.tensor(seq_lens),
            rows,
            rows,
            0.25,
            0,
            0.0,
            torch.zeros(2),
        )
