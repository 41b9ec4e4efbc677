"""The Triton kernels at head sizes that are not powers of two (Phi-2's 80, Phi-3's 96, multi-head
latent attention's 192) against their torch references, a power of two beside them.

Such a head runs in the next power of two's tile with its extra channels masked: a lane read
past the head would add another head's channels to a score, and a lane written past it would
overwrite them, so each test fills every tensor with values that would show either. Run in
Triton's interpreter without CUDA, as tests/test_kernels_triton.py explains.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from baton.core.checkpoint.model_config import RopeConfig
from baton.kernels.kv_cache import write_kv_cache_ref
from baton.kernels.kv_cache_triton import write_kv_cache_triton
from baton.kernels.paged_attention import paged_attention_ref
from baton.kernels.paged_attention_split_kv_triton import paged_decode_split_kv_triton
from baton.kernels.paged_attention_triton import paged_attention_triton
from baton.kernels.rotary import apply_rotary_ref, build_cos_sin_cache
from baton.kernels.rotary_triton import apply_rotary_triton
from tests.test_kernels_triton import (
    BLOCK_SIZE,
    DEVICE,
    MIXED_QUERY_LENS,
    MIXED_SEQ_LENS,
    SINKS,
    close,
    int32,
    packed_batch,
    triton_on_mixed,
)

HEAD_DIMS = [80, 96, 192, 64]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_paged_attention_with_window_softcap_and_sinks_at_any_head_size(head_dim):
    torch.manual_seed(head_dim)
    # GQA 4 over decodes and prefill chunks (tests/test_kernels_triton.py's MIXED batch).
    q, kv_cache, tables, query_start_loc = packed_batch(
        MIXED_QUERY_LENS, MIXED_SEQ_LENS, 8, (2, head_dim), torch.float32
    )
    sinks = torch.tensor(SINKS, device=DEVICE)
    scale = head_dim**-0.5
    expected = paged_attention_ref(
        q, kv_cache, tables, query_start_loc, MIXED_SEQ_LENS, scale, 5, 1.5, sinks=sinks
    )
    actual = triton_on_mixed(
        q, kv_cache, tables, query_start_loc, scale, window=5, softcap=1.5, sinks=sinks
    )
    close(actual, expected, torch.float32)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_split_kv_decode_with_sinks_at_any_head_size(head_dim):
    torch.manual_seed(head_dim)
    seq_lens = [37, 17, 1]
    q, kv_cache, tables, query_start_loc = packed_batch(
        [1] * 3, seq_lens, 8, (2, head_dim), torch.float32
    )
    sinks = torch.tensor(SINKS, device=DEVICE)
    scale = head_dim**-0.5
    expected = paged_attention_ref(
        q, kv_cache, tables, query_start_loc, seq_lens, scale, None, None, sinks=sinks
    )
    # 16-key partitions: the 37-key sequence merges three, two at a time.
    actual = paged_decode_split_kv_triton(
        q,
        kv_cache,
        tables,
        int32(seq_lens),
        max(seq_lens),
        scale,
        max_partitions=4,
        sinks=sinks,
        block_n=16,
        block_p=2,
    )
    close(actual, expected, torch.float32)


def test_paged_attention_in_half_precision_at_head_size_96():
    torch.manual_seed(0)
    q, kv_cache, tables, query_start_loc = packed_batch([1, 5], [9, 5], 4, (2, 96), torch.float16)
    expected = paged_attention_ref(q, kv_cache, tables, query_start_loc, [9, 5], 96**-0.5)
    actual = paged_attention_triton(
        q, kv_cache, tables, int32(query_start_loc), int32([9, 5]), 5, 96**-0.5, block_n=16
    )
    close(actual, expected, torch.float16)


def test_kv_cache_write_leaves_the_neighbouring_heads_channels_alone():
    torch.manual_seed(0)
    slots = torch.tensor([2, 3, -1, 4, 13], device=DEVICE)
    for head_dim in HEAD_DIMS:
        # K and V as strided slices of one fused projection; 3 KV heads pad to a 4-row tile.
        fused = torch.randn(5, 2, 3, head_dim, device=DEVICE)
        key, value = fused[:, 0], fused[:, 1]
        expected = torch.randn(2, 4, BLOCK_SIZE, 3, head_dim, device=DEVICE)
        actual = expected.clone()
        write_kv_cache_ref(key, value, expected, slots)
        write_kv_cache_triton(key, value, actual, slots)
        assert torch.equal(actual, expected), head_dim


def test_rotary_rotates_in_place_and_leaves_the_values_alone():
    torch.manual_seed(0)
    num_heads, num_kv_heads = 3, 1
    rope = RopeConfig(theta=10000.0)
    positions = torch.tensor([0, 1, 7, 63], device=DEVICE)
    for head_dim in HEAD_DIMS:
        cache = build_cos_sin_cache(rope, head_dim, 64, DEVICE)
        qkv = torch.randn(4, (num_heads + 2 * num_kv_heads) * head_dim, device=DEVICE)
        values_before = qkv[:, (num_heads + num_kv_heads) * head_dim :].clone()
        sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        q, k, _ = qkv.split(sizes, dim=-1)
        q = q.view(4, num_heads, head_dim)
        k = k.view(4, num_kv_heads, head_dim)
        expected_q, expected_k = apply_rotary_ref(q, k, positions, cache)
        apply_rotary_triton(q, k, positions, cache)
        close(q, expected_q, torch.float32)
        close(k, expected_k, torch.float32)
        assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_dim :], values_before)


@pytest.mark.parametrize("head_dim", [12, 4])
def test_head_sizes_off_the_multiples_of_8_are_refused_with_the_way_out(head_dim):
    q, kv_cache, tables, query_start_loc = packed_batch([1], [3], 2, (1, head_dim), torch.float32)
    with pytest.raises(ValueError, match=f"multiple of 8, got {head_dim}.*--device cpu"):
        paged_attention_triton(q, kv_cache, tables, int32(query_start_loc), int32([3]), 1, 1.0)
