"""The torch executor on the CPU: cache sizing, and greedy steps that match transformers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from baton.core.batch import Batch, ScheduledSequence
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import EngineConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.executor import TorchExecutor
from baton.gpu.kv_cache import (
    CPU_KV_CACHE_BYTES,
    allocate_kv_caches,
    cpu_num_kv_blocks,
    kv_cache_bytes_per_block,
    zeroed_host_tensor,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=None)


def step_for(
    token_ids: list[int], all_token_ids: list[int], start: int, table: list[int], prompt_len: int
) -> ScheduledSequence:
    return ScheduledSequence(
        request_id="r",
        token_ids=token_ids,
        start_position=start,
        block_table=table,
        sample=start + len(token_ids) >= prompt_len,
        sampling_params=GREEDY,
        all_token_ids=all_token_ids,
        num_prompt_tokens=prompt_len,
    )


def test_greedy_steps_through_the_executor_match_transformers_generate(make_checkpoint) -> None:
    import transformers

    path = make_checkpoint("qwen3")
    executor = TorchExecutor(
        ModelConfig.from_pretrained(path), EngineConfig(block_size=4, num_kv_blocks=32), "cpu"
    )
    prompt = [5, 17, 301, 44, 9, 120, 77, 3, 250, 18, 66]
    table = [31, 2, 17, 8, 25, 11, 0, 19]
    tokens = list(prompt)

    # The prompt in two chunks (the first samples nothing), then one decode per step.
    first = executor.execute(Batch([step_for(prompt[:6], tokens, 0, table, len(prompt))]))
    assert first.sampled_token_ids == []
    while len(tokens) < len(prompt) + 12:
        start = 6 if len(tokens) == len(prompt) else len(tokens) - 1
        seq = step_for(tokens[start:], list(tokens), start, table, len(prompt))
        tokens.append(executor.execute(Batch([seq])).sampled_token_ids[0])

    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor([prompt])
    expected = reference.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False
    )
    assert tokens == expected[0].tolist()


def test_cpu_cache_holds_max_num_seqs_full_length_sequences(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    engine = EngineConfig(max_model_len=100, max_num_seqs=3, block_size=16)

    executor = TorchExecutor(config, engine, device="cpu")

    assert (executor.num_kv_blocks, executor.block_size) == (3 * 7, 16)
    k_cache, v_cache = executor.kv_caches[0]
    assert k_cache.shape == v_cache.shape == (21, 16, config.num_key_value_heads, config.head_dim)
    assert k_cache.dtype == torch.float32


def test_explicit_num_kv_blocks_is_what_the_executor_allocates(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))

    executor = TorchExecutor(config, EngineConfig(num_kv_blocks=5, block_size=8), device="cpu")

    assert executor.num_kv_blocks == 5
    assert len(executor.kv_caches) == config.num_hidden_layers
    assert all(k.shape[:2] == (5, 8) for k, _ in executor.kv_caches)


def test_cpu_cache_of_a_large_model_is_capped_by_the_byte_budget(make_checkpoint) -> None:
    tiny = ModelConfig.from_pretrained(make_checkpoint("llama"))
    large = dataclasses.replace(tiny, num_hidden_layers=32, num_key_value_heads=8, head_dim=128)
    per_block = kv_cache_bytes_per_block(large, 16, torch.float32)

    num_blocks = cpu_num_kv_blocks(large, 8192, 64, 16, torch.float32, available_bytes=2**40)

    assert per_block == 2 * 32 * 8 * 128 * 16 * 4
    assert num_blocks == CPU_KV_CACHE_BYTES // per_block


def test_cpu_cache_takes_at_most_a_quarter_of_available_memory_but_one_sequence(
    make_checkpoint,
) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    per_block = kv_cache_bytes_per_block(config, 16, torch.float32)

    # 64 sequences of 256 tokens need 64 x 16 blocks; a quarter of 400 blocks' worth is 100.
    roomy = cpu_num_kv_blocks(config, 256, 64, 16, torch.float32, 400 * per_block)
    # A quarter of 8 blocks' worth would not hold one sequence: it gets one all the same.
    cramped = cpu_num_kv_blocks(config, 256, 64, 16, torch.float32, 8 * per_block)

    assert (roomy, cramped) == (100, 16)


def test_kv_cache_memory_sizes_the_pool_from_its_budget(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    # 2 layers x (K, V) x 2 KV heads x 16 dims x 4 bytes x 16 tokens: 8 KiB a block.
    assert kv_cache_bytes_per_block(config, 16, torch.float32) == 8 * 1024
    budget = EngineConfig(max_model_len=128, kv_cache_memory_bytes=1024**2)

    executor = TorchExecutor(config, budget, device="cpu")

    assert executor.num_kv_blocks == 128
    assert executor.kv_caches[0].shape[1] == 128


def test_num_kv_blocks_wins_over_kv_cache_memory(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    both = EngineConfig(max_model_len=128, num_kv_blocks=7, kv_cache_memory_bytes=1024**2)

    assert TorchExecutor(config, both, device="cpu").num_kv_blocks == 7


def test_kv_cache_memory_below_one_sequence_is_refused_with_what_it_needs(
    make_checkpoint,
) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    # 5 blocks (80 tokens) where one sequence of 128 tokens needs 8 (64 KiB).
    small = EngineConfig(max_model_len=128, kv_cache_memory_bytes=40 * 1024)

    with pytest.raises(ValueError) as refused:
        TorchExecutor(config, small, device="cpu")

    assert str(refused.value) == (
        "--kv-cache-memory 40 KiB holds 80 tokens of KV cache, less than one sequence of "
        "--max-model-len 128 needs (64 KiB in float32); raise --kv-cache-memory or lower "
        "--max-model-len"
    )


def test_layers_share_one_zeroed_kv_allocation(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))

    caches = allocate_kv_caches(config, 4, 16, torch.float32, "cpu")

    storages = {t.untyped_storage().data_ptr() for layer in caches for t in layer}
    assert len(storages) == 1
    assert all(not t.any() for layer in caches for t in layer)


def test_a_large_cpu_kv_pool_is_zero_and_takes_memory_only_as_written() -> None:
    def rss_mib() -> float:
        status = Path("/proc/self/status").read_text().splitlines()
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

    before = rss_mib()
    pool = zeroed_host_tensor((2, 2, 4096, 16, 4, 64), torch.float32)  # 256 MiB
    assert rss_mib() - before < 32
    block = pool[1, 0, 4095]
    assert not block.any()
    block.fill_(1.0)
    assert rss_mib() - before < 32
    assert int(pool.sum()) == block.numel()


def test_max_model_len_beyond_the_checkpoint_is_refused(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))

    with pytest.raises(ValueError, match="--max-model-len 4096 exceeds"):
        TorchExecutor(config, EngineConfig(max_model_len=4096), device="cpu")


def test_unknown_dtype_is_refused_with_the_choices(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))

    with pytest.raises(ValueError, match="--dtype must be auto or one of float32, bfloat16"):
        TorchExecutor(config, EngineConfig(num_kv_blocks=4), device="cpu", dtype="int8")


def test_startup_logs_the_kv_capacity_in_blocks_tokens_and_bytes(make_checkpoint, caplog) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    num_bytes = 5 * kv_cache_bytes_per_block(config, 8, torch.float32)

    with caplog.at_level("INFO", logger="baton.gpu.executor"):
        TorchExecutor(config, EngineConfig(num_kv_blocks=5, block_size=8), device="cpu")

    assert f"KV cache: 5 blocks of 8 tokens = 40 tokens, {num_bytes / 2**30:.2f} GiB" in caplog.text
