"""The CUDA allocator's peak for the largest step the scheduler may send, measured before the KV
cache is sized, so the cache takes what the step leaves."""

from __future__ import annotations

import torch

from baton.core.batch import Batch, ScheduledSequence
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import EngineConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.input_batch import prepare_inputs
from baton.gpu.kv_cache import allocate_kv_caches


@torch.inference_mode()
def profile_peak_memory(
    model: torch.nn.Module,
    model_config: ModelConfig,
    engine_config: EngineConfig,
    max_model_len: int,
    block_size: int,
    kv_cache_dtype: torch.dtype,
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Run a step as large as the scheduler may send, so the allocator's peak covers it.

    It writes into a throwaway cache just big enough, which the peak then slightly overstates.
    """
    batch = largest_batch(engine_config, max_model_len, block_size)
    num_blocks = sum(len(seq.block_table) for seq in batch.sequences)
    kv_caches = allocate_kv_caches(model_config, num_blocks, block_size, kv_cache_dtype, device)
    inputs = prepare_inputs(batch, block_size, device, dtype)
    hidden = model(inputs.input_ids, inputs.positions, inputs.attn_metadata, kv_caches)
    num_sampled = min(engine_config.max_num_seqs, batch.num_tokens)
    model.compute_logits(hidden[-num_sampled:]).float()
    del kv_caches, hidden
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def largest_batch(engine_config: EngineConfig, max_model_len: int, block_size: int) -> Batch:
    """`max_num_batched_tokens` prompt tokens in sequences of at most `max_model_len`."""
    batch = Batch()
    remaining = engine_config.max_num_batched_tokens
    next_block = 0
    while remaining > 0:
        token_ids = [0] * min(remaining, max_model_len)
        num_blocks = -(-len(token_ids) // block_size)
        batch.sequences.append(
            ScheduledSequence(
                request_id=f"profile-{len(batch.sequences)}",
                token_ids=token_ids,
                start_position=0,
                block_table=list(range(next_block, next_block + num_blocks)),
                sample=True,
                sampling_params=SamplingParams(),
                all_token_ids=token_ids,
                num_prompt_tokens=len(token_ids),
            )
        )
        batch.num_prefill_tokens += len(token_ids)
        remaining -= len(token_ids)
        next_block += num_blocks
    return batch
