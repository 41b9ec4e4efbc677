"""`--kv-cache-dtype float16`: the CPU's KV cache in float16 under a float32 model. Keys and
values are rounded to float16 as they are stored (the C++ write and torch's `.to` agree bit for
bit), and attention reads them widened to float32: the kernels' results are exactly the float32
path's over the widened cache, and greedy output stays the float32 cache's for most prompts."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

import baton.kernels.cpu_extension as cpu_extension
from baton.app.cli import build_parser, engine_config_from
from baton.app.llm import LLM
from baton.app.model_settings import DEMO_MODEL
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import EngineConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.device import resolve_kv_cache_dtype
from baton.gpu.executor import TorchExecutor
from baton.gpu.kv_cache import kv_cache_bytes_per_block
from baton.kernels.cpu_attention_plan import cpu_attention_plan, plain_torch_decodes
from baton.kernels.kv_cache import write_kv_cache_ref
from baton.kernels.paged_attention import paged_attention_cpu
from tests.greedy_agreement import NUM_NEW_TOKENS, PROMPTS, assert_greedy_agreement

needs_kernels = pytest.mark.skipif(
    not cpu_extension.cpu_kernels_available(), reason="Baton's C++ CPU kernels did not build"
)

NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 2, 64, 16, 64
# Where measured (docs/benchmarks.md) every prompt is identical, with float32 and with int8
# weights; two may part at near ties on another CPU's rounding.
MIN_IDENTICAL_PROMPTS = 14


def random_cache(generator: torch.Generator, head_dim: int = HEAD_DIM) -> torch.Tensor:
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, head_dim)
    return torch.randn(shape, generator=generator).to(torch.float16)


def random_batch(generator: torch.Generator, index_dtype: torch.dtype, head_dim: int = HEAD_DIM):
    """Six decoding sequences of 1-150 tokens over shuffled blocks, and their queries."""
    seq_lens = [1, 5, 17, 64, 99, 150]
    width = -(-max(seq_lens) // BLOCK_SIZE)
    blocks = torch.randperm(NUM_BLOCKS, generator=generator)[: len(seq_lens) * width]
    tables = blocks.view(len(seq_lens), width).to(index_dtype)
    q = torch.randn(len(seq_lens), 2 * NUM_KV_HEADS, head_dim, generator=generator)
    return q, tables, seq_lens


@needs_kernels
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (40, 0.0), (0, 30.0)])
# 20: not a multiple of 8, so the scores take the plain loops and the values a vector part and
# a plain tail.
@pytest.mark.parametrize("head_dim", [HEAD_DIM, 20])
def test_the_decode_kernel_reads_float16_as_its_float32_widening(
    index_dtype, window, softcap, head_dim
):
    generator = torch.Generator().manual_seed(0)
    cache = random_cache(generator, head_dim)
    q, tables, seq_lens = random_batch(generator, index_dtype, head_dim)
    rows = torch.arange(len(seq_lens))
    lens = torch.tensor(seq_lens)
    outputs = []
    for kv in (cache, cache.float()):
        out = torch.empty_like(q)
        torch.ops.baton_cpu.paged_attention(
            out, q, kv, tables, lens, rows, rows, head_dim**-0.5, window, softcap
        )
        outputs.append(out)

    assert torch.equal(outputs[0], outputs[1])


@needs_kernels
@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (20, 0.0), (0, 30.0)])
@pytest.mark.parametrize("head_dim", [HEAD_DIM, 20])
def test_a_prefill_chunks_rows_over_float16_have_their_bits_alone_and_over_float32(
    window, softcap, head_dim
):
    # The rows of a chunk share each block's keys and values, widened once for all of them; a
    # row alone widens each value as it loads it. Either way it is the float32 cache's
    # arithmetic on the same values, so the bits agree.
    generator = torch.Generator().manual_seed(4)
    cache = random_cache(generator, head_dim)
    _, tables, seq_lens = random_batch(generator, torch.int32, head_dim)
    # The other sequences' decodes, then the last sequence's final 19 positions as one chunk:
    # more rows than one task takes together, crossing block edges.
    chunk, last = 19, len(seq_lens) - 1
    seqs = torch.tensor([*range(last), *[last] * chunk])
    lens = torch.tensor([*seq_lens[:last], *range(seq_lens[last] - chunk + 1, seq_lens[last] + 1)])
    q = torch.randn(len(seqs), 2 * NUM_KV_HEADS, head_dim, generator=generator)
    if window:
        # Blocks wholly behind every window of their sequence's rows hold NaN: none is read.
        for seq in range(len(seq_lens)):
            first_key = max(0, int(lens[seqs == seq].min()) - window)
            cache[:, tables[seq, : first_key // BLOCK_SIZE].long()] = float("nan")

    def attend(kv: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty(len(rows), *q.shape[1:])
        torch.ops.baton_cpu.paged_attention(
            out,
            q[rows],
            kv,
            tables,
            lens[rows],
            torch.arange(len(rows)),
            seqs[rows],
            head_dim**-0.5,
            window,
            softcap,
        )
        return out

    every = torch.arange(len(seqs))
    batched = attend(cache, every)
    assert not batched.isnan().any()
    assert torch.equal(batched, attend(cache.float(), every))
    for row in range(len(seqs)):
        assert torch.equal(attend(cache, torch.tensor([row]))[0], batched[row])


@needs_kernels
def test_the_rotary_write_rounds_as_torch_does() -> None:
    generator = torch.Generator().manual_seed(1)
    num_heads, tokens = 4, 7
    qkv = torch.randn(tokens, (num_heads + 2 * NUM_KV_HEADS) * HEAD_DIM, generator=generator)
    positions = torch.tensor([0, 3, 9, 10, 11, 30, 31])
    cos_sin = torch.randn(64, HEAD_DIM, generator=generator)
    slots = torch.tensor([5, 17, -1, 40, 41, 100, 255])
    caches = [
        torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype)
        for dtype in (torch.float16, torch.float32)
    ]
    queries = [
        torch.ops.baton_cpu.rotary_and_cache_kv(
            qkv, positions, cos_sin, kv, slots, num_heads, NUM_KV_HEADS
        )
        for kv in caches
    ]

    assert torch.equal(queries[0], queries[1])
    assert torch.equal(caches[0], caches[1].to(torch.float16))
    assert caches[0].abs().sum() > 0  # the stored tokens are there, the skipped one is not


def test_the_python_write_rounds_to_the_cache_dtype() -> None:
    generator = torch.Generator().manual_seed(2)
    key, value = torch.randn(2, 3, NUM_KV_HEADS, HEAD_DIM, generator=generator)
    cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=torch.float16)

    write_kv_cache_ref(key, value, cache, torch.tensor([0, 33, 70]))

    assert torch.equal(cache[0, 2, 1], key[1].to(torch.float16))
    assert torch.equal(cache[1, 4, 6], value[2].to(torch.float16))


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "plain-torch"])
def test_cpu_attention_over_float16_is_float32_attention_over_the_widened_cache(kernel):
    if kernel and not cpu_extension.cpu_kernels_available():
        pytest.skip("Baton's C++ CPU kernels did not build")
    generator = torch.Generator().manual_seed(3)
    cache = random_cache(generator)
    _, tables, seq_lens = random_batch(generator, torch.int32)
    # One prefill chunk of 9 queries (the first sequence's first 9 tokens), then the decodes.
    seq_lens[0] = 9
    query_start_loc = [0, 9, *range(10, 10 + len(seq_lens) - 1)]
    q = torch.randn(query_start_loc[-1], 2 * NUM_KV_HEADS, HEAD_DIM, generator=generator)
    outputs = []
    for kv in (cache, cache.float()):
        with plain_torch_decodes() if not kernel else nullcontext():
            plan = cpu_attention_plan(tables, query_start_loc, seq_lens, BLOCK_SIZE, q.dtype)
            outputs.append(
                paged_attention_cpu(q, kv, tables, query_start_loc, seq_lens, 0.125, plan)
            )

    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("model_impl", ["native", "transformers"])
def test_greedy_output_with_a_float16_cache_agrees_with_float32_for_most_prompts(model_impl):
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=2)
    # A prefill budget smaller than the prompts with the template's tokens: chunked prefills
    # read the float16 cache through the prefill path too. The generic path writes the cache
    # from Python, the native one from C++.
    config = {"num_kv_blocks": 256, "max_num_batched_tokens": 8, "model_impl": model_impl}
    reference = LLM(DEMO_MODEL, device="cpu", **config).generate(PROMPTS, params)
    half = LLM(DEMO_MODEL, device="cpu", kv_cache_dtype="float16", **config).generate(
        PROMPTS, params
    )

    assert_greedy_agreement(reference, half, MIN_IDENTICAL_PROMPTS)


def test_a_float16_cache_holds_twice_the_tokens_of_a_budget(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    budget = 64 * kv_cache_bytes_per_block(config, BLOCK_SIZE, torch.float32)
    engines = {
        dtype: TorchExecutor(
            config,
            EngineConfig(kv_cache_memory_bytes=budget, max_model_len=64, kv_cache_dtype=dtype),
            device="cpu",
        )
        for dtype in ("auto", "float16")
    }

    assert engines["float16"].num_kv_blocks == 2 * engines["auto"].num_kv_blocks == 128
    assert engines["float16"].kv_caches[0].dtype == torch.float16
    assert engines["auto"].kv_caches[0].dtype == torch.float32


def test_the_flag_reaches_the_engine_config_and_bad_values_are_refused() -> None:
    args = build_parser().parse_args(["serve", "--kv-cache-dtype", "float16"])

    assert engine_config_from(args).kv_cache_dtype == "float16"
    with pytest.raises(ValueError, match="--kv-cache-dtype must be one of auto, float16"):
        EngineConfig(kv_cache_dtype="int4")


def test_float16_on_cuda_under_another_model_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="--kv-cache-dtype float16 is for the CPU"):
        resolve_kv_cache_dtype("float16", torch.device("cuda"), torch.bfloat16)
    assert resolve_kv_cache_dtype("float16", torch.device("cuda"), torch.float16) == torch.float16
    assert resolve_kv_cache_dtype("auto", torch.device("cpu"), torch.float32) == torch.float32
