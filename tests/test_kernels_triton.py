"""The Triton kernels against their torch references: natively on a GPU, else in the interpreter.

Without CUDA, `TRITON_INTERPRET=1` is set before any kernel module is imported (the jit
decorator reads it), so the same kernels run on CPU tensors through Triton's interpreter. Shapes
are tiny because the interpreter executes each program in Python.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from baton.core.checkpoint.model_config import RopeConfig
from baton.kernels import ops
from baton.kernels.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from baton.kernels.activation_triton import gelu_tanh_and_mul_triton, silu_and_mul_triton
from baton.kernels.kv_cache import write_kv_cache_ref
from baton.kernels.kv_cache_triton import write_kv_cache_triton
from baton.kernels.paged_attention import paged_attention_ref
from baton.kernels.paged_attention_split_kv_triton import paged_decode_split_kv_triton
from baton.kernels.paged_attention_triton import paged_attention_triton
from baton.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from baton.kernels.rms_norm_triton import fused_add_rms_norm_triton, rms_norm_triton
from baton.kernels.rotary import apply_rotary_ref, build_cos_sin_cache
from baton.kernels.rotary_triton import apply_rotary_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter emulates bfloat16 unfaithfully (numpy has no such type): bf16 runs natively only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOLERANCES = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
BLOCK_SIZE = 4


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual.float(), expected.float(), **TOLERANCES[dtype])


def random_block_tables(num_seqs: int, blocks_per_seq: int, num_blocks: int) -> torch.Tensor:
    """Disjoint, shuffled block ids per sequence, as the block pool hands them out."""
    ids = torch.randperm(num_blocks)[: num_seqs * blocks_per_seq]
    return ids.view(num_seqs, blocks_per_seq).to(torch.int32)


def test_kv_cache_write_skips_padding_and_crosses_blocks():
    torch.manual_seed(0)
    num_kv_heads, head_dim = 3, 16
    # K and V as strided slices of one fused projection, as the model produces them.
    fused = torch.randn(7, 2, num_kv_heads, head_dim, device=DEVICE)
    key, value = fused[:, 0], fused[:, 1]
    # Slots 2..5 straddle blocks 0 and 1; -1 marks padding tokens.
    slots = torch.tensor([2, 3, -1, 4, 5, 13, -1], device=DEVICE)
    expected = torch.zeros(2, 4, BLOCK_SIZE, num_kv_heads, head_dim, device=DEVICE)
    actual = expected.clone()
    write_kv_cache_ref(key, value, expected, slots)
    write_kv_cache_triton(key, value, actual, slots)
    assert torch.equal(actual, expected)
    assert actual.view(2, -1, num_kv_heads, head_dim)[:, [0, 1, 6, 7]].abs().sum() == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_fused_residual_add_match_reference(dtype):
    torch.manual_seed(0)
    # 48 is not a power of two: the kernel masks the tail of its block.
    x = torch.randn(5, 48, device=DEVICE, dtype=dtype)
    residual = torch.randn(5, 48, device=DEVICE, dtype=dtype)
    weight = torch.randn(48, device=DEVICE, dtype=dtype)
    close(rms_norm_triton(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), dtype)
    normed, new_residual = fused_add_rms_norm_triton(x, residual, weight, 1e-6)
    expected_normed, expected_residual = fused_add_rms_norm_ref(x, residual, weight, 1e-6)
    assert torch.equal(new_residual, expected_residual)
    close(normed, expected_normed, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_matches_reference_with_llama3_scaling(dtype):
    torch.manual_seed(0)
    head_dim, num_heads, num_kv_heads = 32, 4, 2
    rope = RopeConfig(
        theta=500000.0, rope_type="llama3", factor=8.0, original_max_position_embeddings=64
    )
    cache = build_cos_sin_cache(rope, head_dim, 256, DEVICE)
    qkv = torch.randn(6, (num_heads + 2 * num_kv_heads) * head_dim, device=DEVICE, dtype=dtype)
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    q, k, _ = qkv.split(sizes, dim=-1)
    q = q.view(6, num_heads, head_dim)
    k = k.view(6, num_kv_heads, head_dim)
    positions = torch.tensor([0, 1, 7, 63, 64, 255], device=DEVICE)
    expected_q, expected_k = apply_rotary_ref(q, k, positions, cache)
    rotated_q, rotated_k = apply_rotary_triton(q, k, positions, cache)
    assert rotated_q.data_ptr() == q.data_ptr() and rotated_k.data_ptr() == k.data_ptr()
    close(q, expected_q, dtype)
    close(k, expected_k, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_reference(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 2 * 40, device=DEVICE, dtype=dtype)
    close(silu_and_mul_triton(x, block=16), silu_and_mul_ref(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_tanh_and_mul_matches_reference(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 2 * 40, device=DEVICE, dtype=dtype) * 3
    close(gelu_tanh_and_mul_triton(x, block=16), gelu_tanh_and_mul_ref(x), dtype)


def packed_batch(query_lens: list[int], seq_lens: list[int], num_heads: int, kv_shape, dtype):
    """Random q, a filled cache and block tables for sequences with these query/sequence lens."""
    num_kv_heads, head_dim = kv_shape
    blocks_per_seq = -(-max(seq_lens) // BLOCK_SIZE)
    num_blocks = len(seq_lens) * blocks_per_seq + 3
    kv_cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, device=DEVICE)
    tables = random_block_tables(len(seq_lens), blocks_per_seq, num_blocks).to(DEVICE)
    query_start_loc = [0]
    for query_len in query_lens:
        query_start_loc.append(query_start_loc[-1] + query_len)
    q = torch.randn(query_start_loc[-1], num_heads, head_dim, device=DEVICE)
    return q.to(dtype), kv_cache.to(dtype), tables, query_start_loc


def int32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


# A decode, a first chunk ending mid-block, a later chunk after cached context, a whole prompt
# ending exactly on a block boundary, and a decode at position 0.
MIXED_QUERY_LENS = [1, 6, 3, 8, 1]
MIXED_SEQ_LENS = [11, 6, 13, 8, 1]


def triton_on_mixed(q, kv_cache, tables, query_start_loc, scale: float, **options) -> torch.Tensor:
    """`paged_attention_triton` over the MIXED batch `packed_batch` built, in 16-row tiles (which
    split the longer chunks across programs) and 16-token KV tiles (four blocks; 16 is the
    smallest tile `tl.dot` compiles for natively)."""
    return paged_attention_triton(
        q,
        kv_cache,
        tables,
        int32(query_start_loc),
        int32(MIXED_SEQ_LENS),
        max(MIXED_QUERY_LENS),
        scale,
        block_m=16,
        block_n=16,
        **options,
    )


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"),
    [(2, 2, 64), (8, 2, 128), (8, 1, 64), (7, 1, 16)],
    ids=["mha-d64", "gqa4-d128", "mqa8-d64", "gqa7-d16"],
)
def test_paged_attention_mixed_decode_and_prefill_matches_reference(
    num_heads, num_kv_heads, head_dim
):
    torch.manual_seed(0)
    q, kv_cache, tables, query_start_loc = packed_batch(
        MIXED_QUERY_LENS, MIXED_SEQ_LENS, num_heads, (num_kv_heads, head_dim), torch.float32
    )
    scale = head_dim**-0.5
    expected = paged_attention_ref(q, kv_cache, tables, query_start_loc, MIXED_SEQ_LENS, scale)
    actual = triton_on_mixed(q, kv_cache, tables, query_start_loc, scale)
    close(actual, expected, torch.float32)


@pytest.mark.parametrize(("window", "softcap"), [(3, None), (None, 1.5), (5, 1.5)])
def test_paged_attention_window_and_softcap_match_reference(window, softcap):
    torch.manual_seed(1)
    q, kv_cache, tables, query_start_loc = packed_batch(
        MIXED_QUERY_LENS, MIXED_SEQ_LENS, 8, (2, 16), torch.float32
    )
    expected = paged_attention_ref(
        q, kv_cache, tables, query_start_loc, MIXED_SEQ_LENS, 0.25, window, softcap
    )
    actual = triton_on_mixed(
        q, kv_cache, tables, query_start_loc, 0.25, window=window, softcap=softcap
    )
    close(actual, expected, torch.float32)


# Per query head, from far below every score to far above it (gpt-oss's attention sinks).
SINKS = [-30.0, -1.0, 0.0, 0.5, 2.0, 4.0, 8.0, 30.0]


@pytest.mark.parametrize(("window", "num_kv_heads"), [(None, 2), (3, 2), (5, 8), (None, 1)])
def test_paged_attention_sinks_match_reference_with_windows_and_gqa(window, num_kv_heads):
    torch.manual_seed(2)
    q, kv_cache, tables, query_start_loc = packed_batch(
        MIXED_QUERY_LENS, MIXED_SEQ_LENS, 8, (num_kv_heads, 16), torch.float32
    )
    sinks = torch.tensor(SINKS, device=DEVICE)
    expected = paged_attention_ref(
        q, kv_cache, tables, query_start_loc, MIXED_SEQ_LENS, 0.25, window, None, sinks=sinks
    )
    actual = triton_on_mixed(q, kv_cache, tables, query_start_loc, 0.25, window=window, sinks=sinks)
    close(actual, expected, torch.float32)


@pytest.mark.parametrize("num_kv_heads", [2, 8])
def test_split_kv_decode_with_sinks_matches_reference(num_kv_heads):
    torch.manual_seed(3)
    seq_lens = [37, 17, 1]
    q, kv_cache, tables, query_start_loc = packed_batch(
        [1] * 3, seq_lens, 8, (num_kv_heads, 16), torch.float32
    )
    sinks = torch.tensor(SINKS, device=DEVICE)
    expected = paged_attention_ref(
        q, kv_cache, tables, query_start_loc, seq_lens, 0.25, None, None, sinks=sinks
    )
    actual = paged_decode_split_kv_triton(
        q, kv_cache, tables, int32(seq_lens), 60, 0.25, max_partitions=4, sinks=sinks, block_n=16
    )
    close(actual, expected, torch.float32)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float32])
def test_paged_attention_in_half_precision_matches_reference(dtype):
    torch.manual_seed(0)
    q, kv_cache, tables, query_start_loc = packed_batch([1, 5], [9, 5], 4, (2, 64), dtype)
    expected = paged_attention_ref(q, kv_cache, tables, query_start_loc, [9, 5], 0.125)
    actual = paged_attention_triton(
        q, kv_cache, tables, int32(query_start_loc), int32([9, 5]), 5, 0.125, block_n=16
    )
    close(actual, expected, dtype)


@pytest.mark.parametrize("max_partitions", [2, 64])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(4, 1, 128), (8, 8, 64)], ids=["gqa4", "mha"]
)
def test_split_kv_decode_merges_partitions_like_one_pass(
    num_heads, num_kv_heads, head_dim, max_partitions
):
    torch.manual_seed(0)
    seq_lens = [37, 17, 8, 1]
    q, kv_cache, tables, query_start_loc = packed_batch(
        [1] * 4, seq_lens, num_heads, (num_kv_heads, head_dim), torch.float32
    )
    scale = head_dim**-0.5
    expected = paged_attention_ref(q, kv_cache, tables, query_start_loc, seq_lens, scale)
    # A grid sized past the longest sequence (as a CUDA graph fixes it) changes nothing: with
    # 16-key tiles it has 5 partitions (or 2). Each sequence cuts its own: 37 keys into 3
    # partitions of 16 (or 2 of 32), 17 into 2, 8 and 1 into one; the merge skips the empty
    # rest of each row, reading 2 partitions at a time.
    grid_len = max(seq_lens) + 40
    actual = paged_decode_split_kv_triton(
        q,
        kv_cache,
        tables,
        int32(seq_lens),
        grid_len,
        scale,
        max_partitions=max_partitions,
        block_n=16,
        block_p=2,
    )
    close(actual, expected, torch.float32)


def test_ops_pick_the_reference_off_cuda_and_triton_on_cuda_unless_forced():
    x = torch.randn(2, 8, device=DEVICE)
    assert ops.uses_triton(x) == (DEVICE == "cuda")
    with ops.force_triton():
        assert ops.uses_triton(x)
        with ops.force_reference():
            assert not ops.uses_triton(x)
        assert ops.uses_triton(x)
    assert ops.uses_triton(x) == (DEVICE == "cuda")
    # Forced to the reference, the CPU path is the reference itself, bit for bit.
    cpu = torch.randn(2, 16)
    with ops.force_reference():
        assert torch.equal(ops.silu_and_mul(cpu), silu_and_mul_ref(cpu))


class Unreadable(list):
    """A Python list of the batch that the graph-safe Triton path must never read."""

    def _refuse(self, *args, **kwargs):
        raise AssertionError("the Triton path read a Python list of the batch")

    __len__ = __iter__ = __getitem__ = _refuse


def test_ops_paged_attention_triton_path_reads_only_the_batch_tensors():
    torch.manual_seed(0)
    query_lens, seq_lens = [1, 3, 1], [6, 3, 2]
    q, kv_cache, tables, query_start_loc = packed_batch(
        query_lens, seq_lens, 4, (2, 16), torch.float32
    )
    batch = SimpleNamespace(
        block_tables=tables,
        query_start_loc=Unreadable(),
        seq_lens=Unreadable(),
        query_start_loc_tensor=int32(query_start_loc),
        seq_lens_tensor=int32(seq_lens),
        max_query_len=3,
        max_seq_len=6,
    )
    expected = paged_attention_ref(q, kv_cache, tables, query_start_loc, seq_lens, 0.25)
    with ops.force_triton():
        close(ops.paged_attention(q, kv_cache, batch, 0.25), expected, torch.float32)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float32])
def test_split_kv_decode_in_half_precision_matches_reference(dtype):
    torch.manual_seed(0)
    seq_lens = [21, 5]
    q, kv_cache, tables, query_start_loc = packed_batch([1, 1], seq_lens, 4, (2, 64), dtype)
    expected = paged_attention_ref(q, kv_cache, tables, query_start_loc, seq_lens, 0.125)
    actual = paged_decode_split_kv_triton(
        q, kv_cache, tables, int32(seq_lens), 64, 0.125, max_partitions=4, block_n=16
    )
    close(actual, expected, dtype)


def test_split_kv_when_the_plain_grid_leaves_sms_idle():
    # The choice the H200 measurements made (docs/decisions.md): split-KV for long contexts
    # at small batches, the plain grid once the batch alone fills the SMs (batch 64).
    assert ops.use_split_kv(num_seqs=1, num_kv_heads=8, max_seq_len=8192, num_sms=132)
    assert ops.use_split_kv(num_seqs=1, num_kv_heads=8, max_seq_len=512, num_sms=132)
    assert ops.use_split_kv(num_seqs=16, num_kv_heads=8, max_seq_len=1024, num_sms=132)
    assert not ops.use_split_kv(num_seqs=64, num_kv_heads=8, max_seq_len=8192, num_sms=132)
    assert not ops.use_split_kv(num_seqs=1, num_kv_heads=8, max_seq_len=128, num_sms=132)


def test_split_kv_grid_aims_at_four_programs_per_sm_and_eight_partitions():
    assert ops.split_kv_max_partitions(num_seqs=1, num_kv_heads=8, num_sms=132) == 66
    assert ops.split_kv_max_partitions(num_seqs=4, num_kv_heads=8, num_sms=132) == 17
    # Five partitions would fill the SMs four times over, but at 16k keys each program's walk
    # is long, so the grid never takes fewer than SPLIT_KV_MIN_PARTITIONS.
    assert ops.split_kv_max_partitions(num_seqs=16, num_kv_heads=8, num_sms=132) == 8
