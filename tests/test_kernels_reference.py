"""The plain-torch kernels against straightforward formulas and transformers' own numerics."""

from __future__ import annotations

import random

import pytest
import torch

from baton.core.checkpoint.model_config import RopeConfig
from baton.kernels.activation import silu_and_mul_ref
from baton.kernels.kv_cache import write_kv_cache_ref
from baton.kernels.paged_attention import paged_attention_ref
from baton.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from baton.kernels.rotary import apply_rotary_ref, build_cos_sin_cache, rope_inv_freq

HEAD_DIM = 32
# (seq_len, query_len): decodes, whole prompts, chunks starting and ending on and off block edges.
SEQUENCES = [(1, 1), (37, 1), (16, 16), (23, 23), (40, 7), (32, 16), (9, 1), (50, 18)]


def dense_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, chunk: int | None = None
) -> torch.Tensor:
    """Attention of the last len(q) of len(k) tokens, in float64 with an explicit mask; with
    `chunk`, each query sees only the keys of its own `chunk`-token chunk."""
    query_len, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    query_pos = torch.arange(seq_len - query_len, seq_len)
    key_pos = torch.arange(seq_len)[None, :]
    visible = key_pos <= query_pos[:, None]
    if chunk is not None:
        visible &= key_pos >= (query_pos // chunk * chunk)[:, None]
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize("chunk", [None, 12], ids=["causal", "chunked"])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (16, 2), (8, 1)])
def test_paged_attention_matches_dense_causal_attention_on_a_mixed_packed_batch(
    block_size: int, num_heads: int, num_kv_heads: int, chunk: int | None
) -> None:
    rng = random.Random(block_size * 100 + num_heads * 10 + num_kv_heads)
    torch.manual_seed(rng.randrange(2**31))
    num_blocks = sum(-(-seq_len // block_size) for seq_len, _ in SEQUENCES) + 5
    free_blocks = list(range(num_blocks))
    rng.shuffle(free_blocks)
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, HEAD_DIM)
    k_cache, v_cache = kv_cache.unbind(0)

    max_blocks = max(-(-seq_len // block_size) for seq_len, _ in SEQUENCES)
    block_tables = torch.zeros(len(SEQUENCES), max_blocks, dtype=torch.int32)
    query_start_loc, queries, keys, values = [0], [], [], []
    for i, (seq_len, query_len) in enumerate(SEQUENCES):
        table = [free_blocks.pop() for _ in range(-(-seq_len // block_size))]
        block_tables[i, : len(table)] = torch.tensor(table)
        k, v = torch.randn(2, seq_len, num_kv_heads, HEAD_DIM).unbind(0)
        for pos in range(seq_len):
            k_cache[table[pos // block_size], pos % block_size] = k[pos]
            v_cache[table[pos // block_size], pos % block_size] = v[pos]
        keys.append(k)
        values.append(v)
        queries.append(torch.randn(query_len, num_heads, HEAD_DIM))
        query_start_loc.append(query_start_loc[-1] + query_len)

    scale = HEAD_DIM**-0.5
    out = paged_attention_ref(
        torch.cat(queries),
        kv_cache,
        block_tables,
        query_start_loc,
        [seq_len for seq_len, _ in SEQUENCES],
        scale,
        chunk=chunk,
    )

    assert out.shape == (query_start_loc[-1], num_heads, HEAD_DIM)
    for i, (q, k, v) in enumerate(zip(queries, keys, values, strict=True)):
        expected = dense_causal_attention(q, k, v, scale, chunk).float()
        rows = out[query_start_loc[i] : query_start_loc[i + 1]]
        torch.testing.assert_close(rows, expected, atol=1e-5, rtol=1e-5)


def test_kv_write_stores_each_token_at_its_slot_and_skips_padding() -> None:
    block_size, num_blocks = 4, 3
    kv_cache = torch.zeros(2, num_blocks, block_size, 2, 8)
    k_cache, v_cache = kv_cache.unbind(0)
    key, value = torch.randn(2, 5, 2, 8).unbind(0)
    slot_mapping = torch.tensor([9, -1, 0, 7, -1])

    write_kv_cache_ref(key, value, kv_cache, slot_mapping)

    for token, (block, offset) in {0: (2, 1), 2: (0, 0), 3: (1, 3)}.items():
        assert torch.equal(k_cache[block, offset], key[token])
        assert torch.equal(v_cache[block, offset], value[token])
    written = k_cache.abs().sum(dim=(2, 3)) != 0
    assert written.sum().item() == 3


def test_rms_norm_matches_the_formula() -> None:
    x = torch.randn(6, 64) * 3
    weight = torch.randn(64)
    eps = 1e-6
    x64 = x.double()
    expected = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()

    torch.testing.assert_close(rms_norm_ref(x, weight, eps), expected.float())


def test_rms_norm_in_bfloat16_computes_in_float32_and_returns_bfloat16() -> None:
    x = (torch.randn(4, 64) * 50).bfloat16()
    weight = torch.randn(64).bfloat16()
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)

    out = rms_norm_ref(x, weight, 1e-5)

    assert out.dtype == torch.bfloat16
    assert torch.equal(out, weight * normed.bfloat16())


def test_fused_add_rms_norm_returns_the_normed_sum_and_the_sum() -> None:
    x, residual = torch.randn(2, 5, 32).unbind(0)
    weight = torch.randn(32)

    normed, new_residual = fused_add_rms_norm_ref(x, residual, weight, 1e-6)

    torch.testing.assert_close(new_residual, x + residual)
    torch.testing.assert_close(normed, rms_norm_ref(x + residual, weight, 1e-6))


LLAMA3_ROPE = RopeConfig(
    theta=500000.0,
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)


def _hf_llama_config(rope: RopeConfig, head_dim: int):
    import transformers

    parameters = {"rope_type": rope.rope_type, "rope_theta": rope.theta}
    if rope.rope_type == "llama3":
        parameters.update(
            factor=rope.factor,
            low_freq_factor=rope.low_freq_factor,
            high_freq_factor=rope.high_freq_factor,
            original_max_position_embeddings=rope.original_max_position_embeddings,
        )
    return transformers.LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rope_parameters=parameters,
    )


def test_llama3_rope_frequencies_match_transformers() -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](_hf_llama_config(LLAMA3_ROPE, 128), "cpu")
    ours = rope_inv_freq(LLAMA3_ROPE, 128)

    # All three regimes are exercised: kept, divided by `factor`, and blended.
    unscaled = rope_inv_freq(RopeConfig(theta=500000.0), 128)
    ratio = unscaled / ours
    assert ratio[0] == 1.0 and ratio[-1] == pytest.approx(8.0)
    assert ((ratio > 1.01) & (ratio < 7.99)).any()
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-6)


@pytest.mark.parametrize(
    "rope", [RopeConfig(theta=10000.0), LLAMA3_ROPE], ids=["default", "llama3"]
)
def test_rotary_matches_transformers_llama(rope: RopeConfig) -> None:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    head_dim = 64
    positions = torch.tensor([0, 1, 2, 17, 300, 5000, 9000, 20000])
    q = torch.randn(len(positions), 8, head_dim)
    k = torch.randn(len(positions), 2, head_dim)
    cos, sin = LlamaRotaryEmbedding(_hf_llama_config(rope, head_dim))(q, positions[None])
    # transformers wants [batch, heads, tokens, head_dim].
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)

    cache = build_cos_sin_cache(rope, head_dim, max_positions=20001)
    ours_q, ours_k = apply_rotary_ref(q, k, positions, cache)

    torch.testing.assert_close(ours_q, hf_q[0].transpose(0, 1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours_k, hf_k[0].transpose(0, 1), atol=1e-6, rtol=1e-5)


def test_silu_and_mul_gates_the_second_half_with_silu_of_the_first() -> None:
    x = torch.randn(3, 2 * 24)
    gate, up = x.double()[:, :24], x.double()[:, 24:]
    expected = gate / (1 + torch.exp(-gate)) * up

    out = silu_and_mul_ref(x)

    assert out.shape == (3, 24)
    torch.testing.assert_close(out, expected.float())
