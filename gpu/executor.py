"""The torch executor: Baton's model over a packed batch on the CPU or one CUDA GPU."""

from __future__ import annotations

import torch

from core.batch import Batch, ExecutorOutput, ScheduledSequence
from core.config import EngineConfig
from core.model_config import ModelConfig
from core.sampling_params import SamplingParams
from gpu.input_batch import prepare_inputs
from gpu.kv_cache import allocate_kv_caches, cpu_num_kv_blocks, cuda_num_kv_blocks
from gpu.loader import load_model
from gpu.sampler import Sampler

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """`auto` picks CUDA when a GPU is visible, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA GPU; use --device cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is float32 on the CPU (the exact reference path) and bfloat16 on CUDA."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


class TorchExecutor:
    """Loads a checkpoint, allocates its paged KV cache and runs one step per `execute` call.

    `num_kv_blocks` and `block_size` describe the cache, which block ids in batches index.
    """

    def __init__(
        self,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        device: str = "auto",
        dtype: str = "auto",
        load_format: str = "auto",
    ) -> None:
        self.model_config = model_config
        self.engine_config = engine_config
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.max_model_len = engine_config.max_model_len or model_config.max_model_len
        if self.max_model_len > model_config.max_model_len:
            raise ValueError(
                f"--max-model-len {self.max_model_len} exceeds what {model_config.path} serves "
                f"exactly ({model_config.max_model_len} tokens); lower it"
            )
        self.block_size = engine_config.block_size
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.model = load_model(
            model_config, self.device, self.dtype, self.max_model_len, load_format
        )
        self.num_kv_blocks = engine_config.num_kv_blocks or self._fitting_num_kv_blocks()
        self.kv_caches = allocate_kv_caches(
            model_config, self.num_kv_blocks, self.block_size, self.dtype, self.device
        )
        self.sampler = Sampler(model_config.vocab_size, model_config.eos_token_ids)
        # Requests without a seed draw from the global generator: --seed makes a server run
        # repeatable as a whole (requests with their own seed are repeatable regardless).
        torch.manual_seed(engine_config.seed)

    @torch.inference_mode()
    def execute(self, batch: Batch) -> ExecutorOutput:
        """Compute the batch's KV, then sample one token for each sequence with `sample=True`."""
        if not batch.sequences:
            return ExecutorOutput(sampled_token_ids=[])
        inputs = prepare_inputs(batch, self.block_size, self.device)
        hidden = self.model(
            inputs.input_ids, inputs.positions, inputs.attn_metadata, self.kv_caches
        )
        to_sample = [seq for seq in batch.sequences if seq.sample]
        if not to_sample:
            return ExecutorOutput(sampled_token_ids=[])
        logits = self.model.compute_logits(hidden[inputs.logits_indices]).float()
        return self.sampler(logits, to_sample)

    def _fitting_num_kv_blocks(self) -> int:
        if self.device.type == "cpu":
            return cpu_num_kv_blocks(
                self.model_config,
                self.max_model_len,
                self.engine_config.max_num_seqs,
                self.block_size,
                self.dtype,
            )
        self._profile_forward()
        return cuda_num_kv_blocks(
            self.model_config,
            self.block_size,
            self.dtype,
            self.engine_config.gpu_memory_utilization,
            self.device,
        )

    @torch.inference_mode()
    def _profile_forward(self) -> None:
        """Run a step as large as the scheduler may send, so the allocator's peak covers it.

        It writes into a throwaway cache just big enough, which the peak then slightly overstates.
        """
        batch = self._largest_batch()
        num_blocks = sum(len(seq.block_table) for seq in batch.sequences)
        kv_caches = allocate_kv_caches(
            self.model_config, num_blocks, self.block_size, self.dtype, self.device
        )
        inputs = prepare_inputs(batch, self.block_size, self.device)
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.attn_metadata, kv_caches)
        num_sampled = min(self.engine_config.max_num_seqs, batch.num_tokens)
        self.model.compute_logits(hidden[-num_sampled:]).float()
        del kv_caches, hidden
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def _largest_batch(self) -> Batch:
        """`max_num_batched_tokens` prompt tokens in sequences of at most `max_model_len`."""
        batch = Batch()
        remaining = self.engine_config.max_num_batched_tokens
        next_block = 0
        while remaining > 0:
            token_ids = [0] * min(remaining, self.max_model_len)
            num_blocks = -(-len(token_ids) // self.block_size)
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
