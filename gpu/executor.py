"""The torch executor: Baton's model over a packed batch on the CPU or one CUDA GPU."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from baton.core.batch import Batch, ExecutorOutput, ScheduledSequence
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import EngineConfig
from baton.core.kv_cache.host_memory import release_freed_heap
from baton.gpu.cuda_graph import DecodeGraphs, graph_batch_sizes
from baton.gpu.device import resolve_device, resolve_dtype, resolve_kv_cache_dtype
from baton.gpu.draft_runner import DraftRunner
from baton.gpu.input_batch import InputBuffers
from baton.gpu.kv_cache import (
    allocate_kv_caches,
    budget_num_kv_blocks,
    cpu_num_kv_blocks,
    cuda_num_kv_blocks,
    kv_cache_bytes_per_block,
)
from baton.gpu.kv_transfer import read_blocks, write_blocks
from baton.gpu.memory_profile import profile_peak_memory
from baton.gpu.models.quantization import check_quantization
from baton.gpu.pooling import pooled_parts
from baton.gpu.prepared_model import prepare_model
from baton.gpu.prompt_logprobs import prompt_logprobs
from baton.gpu.rejection_sampler import verification_rows, verify
from baton.gpu.sampler import Sampler
from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.cpu_threads import set_cpu_threads
from baton.kernels.linear import cpu_has_native_bf16

if TYPE_CHECKING:  # xgrammar (and transformers) load with the first structured-output request
    from baton.gpu.structured_output import GrammarMask, GrammarMatchers, XGrammarCompiler

logger = logging.getLogger(__name__)


class TorchExecutor:
    """Loads a checkpoint, allocates its paged KV cache and runs one step per `execute` call.

    `num_kv_blocks` and `block_size` describe the cache, which block ids in batches index.
    On CUDA, decode-only steps replay CUDA graphs (`graphs`; None on the CPU and with
    `enforce_eager`); on the CPU every step runs the decoder layers in one C++ call
    (`cpu_layers`, for the models it takes). Running totals for benchmarks: `num_steps`,
    `num_graph_steps`, `num_cpu_layer_steps`, `host_time_s` (building inputs, until the
    forward is enqueued) and `step_time_s` (whole steps; a step that samples nothing returns
    without waiting for the GPU).
    """

    def __init__(
        self,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        device: str = "auto",
        dtype: str = "auto",
        load_format: str = "auto",
        draft_model_config: ModelConfig | None = None,
    ) -> None:
        """`draft_model_config`: the draft model of --speculative-method draft, checked against
        the model (baton.core.speculative.draft_model)."""
        self.model_config = model_config
        self.engine_config = engine_config
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.kv_cache_dtype = resolve_kv_cache_dtype(
            engine_config.kv_cache_dtype, self.device, self.dtype
        )
        self.quantization = engine_config.quantization
        check_quantization(self.quantization, model_config.model_impl, self.device)
        if self.device.type == "cpu" and self.dtype == torch.bfloat16 and not cpu_has_native_bf16():
            logger.warning(
                "--dtype bfloat16 on a CPU without AVX512_BF16 or AMX: every bfloat16 matmul is "
                "emulated through float32, slower than --dtype float32 at batched steps; for "
                "the fastest CPU path use --dtype float32 (--quantization int8 for smaller weights)"
            )
        self.max_model_len = engine_config.max_model_len or model_config.max_model_len
        if self.max_model_len > model_config.max_model_len:
            raise ValueError(
                f"--max-model-len {self.max_model_len} exceeds what {model_config.path} serves "
                f"exactly ({model_config.max_model_len} tokens); lower it"
            )
        self.block_size = engine_config.block_size
        if self.device.type == "cpu":
            threads = set_cpu_threads(engine_config.cpu_threads)
            logger.info("the CPU step computes on %d threads (--cpu-threads)", threads)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        prepared = prepare_model(
            model_config, engine_config, self.device, self.dtype, self.max_model_len, load_format
        )
        self.model = prepared.model
        self.model_config = model_config = prepared.config
        self.cpu_layers = prepared.cpu_layers
        # Built (or loaded from the build cache) here, not inside the first step.
        if self.device.type == "cpu" and cpu_kernels_available():
            logger.info("attention (prefill and decode) runs in Baton's C++ CPU kernel")
        # A padded graph batch may hold more tokens than the budget when max_num_seqs exceeds it.
        self.buffers = InputBuffers(
            max(engine_config.max_num_batched_tokens, engine_config.max_num_seqs),
            engine_config.max_num_seqs,
            self.max_model_len,
            self.block_size,
            self.device,
            self.dtype,
        )
        # Loaded before the cache is sized: its weights take memory, its layers block bytes.
        self.draft_config = draft_model_config
        self.draft = (
            None
            if draft_model_config is None
            else DraftRunner.load(
                draft_model_config,
                engine_config,
                self.device,
                self.dtype,
                self.max_model_len,
                load_format,
            )
        )
        self.num_kv_blocks = engine_config.num_kv_blocks or self._fitting_num_kv_blocks()
        self.kv_caches = allocate_kv_caches(
            model_config, self.num_kv_blocks, self.block_size, self.kv_cache_dtype, self.device
        )
        if self.draft is not None:
            self.draft.allocate(
                self.num_kv_blocks, self.block_size, self.kv_cache_dtype, self.device
            )
        self.kv_bytes_per_token = (
            kv_cache_bytes_per_block(model_config, self.block_size, self.kv_cache_dtype)
            // self.block_size
        )
        self._log_kv_capacity()
        if self.device.type == "cpu":
            release_freed_heap()
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda" and not engine_config.enforce_eager:
            if model_config.model_impl == "native" and self.model.graph_capturable:
                self.graphs = self._captured_graphs()
            else:
                logger.info(
                    "no CUDA graphs: %s runs on the generic path, or has windowed, "
                    "soft-capped or MoE layers",
                    model_config.architecture,
                )
        self.sampler = Sampler(model_config.vocab_size, model_config.eos_token_ids)
        self._grammar_matchers: GrammarMatchers | None = None
        self._grammar_compiler: XGrammarCompiler | None = None
        self._grammar_compiler_lock = threading.Lock()
        # Fills grammar bitmasks while the forward runs (they depend only on earlier tokens).
        self._mask_worker = ThreadPoolExecutor(1, thread_name_prefix="baton-grammar")
        # Requests without a seed draw from the global generator: --seed makes a server run
        # repeatable as a whole (requests with their own seed are repeatable regardless).
        torch.manual_seed(engine_config.seed)
        self.num_steps = 0
        self.num_graph_steps = 0
        self.num_cpu_layer_steps = 0
        self.host_time_s = 0.0
        self.step_time_s = 0.0

    @torch.inference_mode()
    def execute(self, batch: Batch) -> ExecutorOutput:
        """Compute the batch's KV, then sample one token for each sequence with `sample=True`."""
        if self._grammar_matchers is not None:
            self._grammar_matchers.release(batch.finished_request_ids)
        if self.draft is not None:
            self.draft.release(batch.finished_request_ids)
        if not batch.sequences:
            return ExecutorOutput(sampled_token_ids=[])
        start = time.perf_counter()
        if self.draft is not None:
            batch = self.draft.propose(batch)
        to_sample = [seq for seq in batch.sequences if seq.sample]
        # With draft tokens, a row per position sampled (rejection_sampler.py).
        rows = verification_rows(to_sample) if batch.num_draft_tokens else to_sample
        mask = self._start_grammar_mask(rows, drafted=rows is not to_sample)
        padded_size = self.graphs.padded_size(batch) if self.graphs is not None else None
        inputs = self.buffers.prepare(batch, pad_to=padded_size)
        self.host_time_s += time.perf_counter() - start
        if self.graphs is not None and padded_size is not None:
            hidden = self.graphs.run(inputs)
            self.num_graph_steps += 1
        elif self.cpu_layers is not None and self.cpu_layers.takes(
            inputs.input_ids, inputs.attn_metadata
        ):
            hidden = self.cpu_layers.forward(
                inputs.input_ids, inputs.positions, inputs.attn_metadata, self.kv_caches
            )
            self.num_cpu_layer_steps += 1
        else:
            hidden = self.model(
                inputs.input_ids, inputs.positions, inputs.attn_metadata, self.kv_caches
            )
        output = self._sample(to_sample, rows, hidden, inputs.logits_indices, mask)
        if self.draft is not None and batch.num_draft_tokens:
            self.draft.settle(to_sample, output)
        if batch.num_prompt_logprobs:
            output.prompt_logprobs = prompt_logprobs(
                batch,
                hidden,
                inputs.attn_metadata.query_start_loc,
                self.model.compute_logits,
                self.model_config.vocab_size,
            )
        if batch.num_pooled:
            output.pooled = pooled_parts(batch, hidden, inputs.attn_metadata.query_start_loc)
        self.num_steps += 1
        self.step_time_s += time.perf_counter() - start
        return output

    def read_kv(self, block_ids: Sequence[int]) -> object:
        """The KV of `block_ids` for another engine's `write_kv` (core/executor.py's KVTransfer):
        with a draft model, its KV of the same blocks beside the model's, so the decoding engine
        drafts from the whole prompt."""
        contents = read_blocks(self.kv_caches, block_ids)
        if self.draft is None:
            return contents
        return contents, read_blocks(self.draft.kv_caches, block_ids)

    def write_kv(self, block_ids: Sequence[int], contents: object) -> None:
        if self.draft is None:
            write_blocks(self.kv_caches, block_ids, contents)
            return
        if not isinstance(contents, tuple) or len(contents) != 2:
            raise ValueError(
                "KV contents without a draft model's KV: the prefill and decode replicas must "
                "serve the same --speculative-model"
            )
        write_blocks(self.kv_caches, block_ids, contents[0])
        write_blocks(self.draft.kv_caches, block_ids, contents[1])

    @property
    def grammar_compiler(self) -> XGrammarCompiler:
        """Structured output's compiler (baton.core.structured_output.GrammarCompiler), built on
        first use: reading the vocabulary costs start-up time a server without it never pays."""
        with self._grammar_compiler_lock:
            if self._grammar_compiler is None:
                from baton.gpu.structured_output import XGrammarCompiler

                self._grammar_compiler = XGrammarCompiler(
                    self.model_config.path,
                    self.model_config.vocab_size,
                    self.model_config.eos_token_ids,
                    self.engine_config.grammar_cache_bytes,
                )
            return self._grammar_compiler

    @property
    def built_grammar_compiler(self) -> XGrammarCompiler | None:
        """The compiler if a request has needed it yet, else None (without building it)."""
        return self._grammar_compiler

    def _start_grammar_mask(
        self, to_sample: list[ScheduledSequence], drafted: bool = False
    ) -> Future[GrammarMask | None] | None:
        """`drafted`: `to_sample` are verification rows, several to a request."""
        if not any(seq.sampling_params.structured_output is not None for seq in to_sample):
            return None
        if self._grammar_matchers is None:
            from baton.gpu.structured_output import GrammarMatchers

            self._grammar_matchers = GrammarMatchers(self.model_config.vocab_size)
        matchers = self._grammar_matchers
        fill = matchers.fill_draft_mask if drafted else matchers.fill_mask
        return self._mask_worker.submit(fill, to_sample)

    def _sample(
        self,
        to_sample: list[ScheduledSequence],
        rows: list[ScheduledSequence],
        hidden: torch.Tensor,
        logits_indices: torch.Tensor,
        mask: Future[GrammarMask | None] | None,
    ) -> ExecutorOutput:
        """`rows` is `to_sample` unless some carry draft tokens: then one per verified position."""
        if not to_sample:
            return ExecutorOutput(sampled_token_ids=[])
        # As many rows sampled as there are means one token a sequence, each sampled, in order.
        sampled = hidden if logits_indices.shape[0] == hidden.shape[0] else hidden[logits_indices]
        logits = self.model.compute_logits(sampled).float()
        grammar_mask = mask.result() if mask is not None else None
        if rows is not to_sample:
            # The matchers catch up with the accepted tokens as the next mask levels them.
            return verify(self.sampler, logits, to_sample, rows, grammar_mask)
        output = self.sampler(logits, to_sample, grammar_mask)
        if grammar_mask is not None and self._grammar_matchers is not None:
            self._grammar_matchers.accept(to_sample, output.sampled_token_ids)
        return output

    def _log_kv_capacity(self) -> None:
        num_bytes = self.num_kv_blocks * kv_cache_bytes_per_block(
            self.model_config, self.block_size, self.kv_cache_dtype, self.draft_config
        )
        logger.info(
            "KV cache: %d blocks of %d tokens = %d tokens, %.2f GiB (%s)",
            self.num_kv_blocks,
            self.block_size,
            self.num_kv_blocks * self.block_size,
            num_bytes / 2**30,
            self.kv_cache_dtype,
        )

    def _captured_graphs(self) -> DecodeGraphs:
        graphs = DecodeGraphs(
            self.model,
            self.kv_caches,
            self.buffers,
            graph_batch_sizes(self.engine_config.max_num_seqs),
        )
        start = time.perf_counter()
        graphs.capture()
        logger.info(
            "CUDA graphs: captured decode batch sizes %s in %.1f s",
            graphs.captured_sizes,
            time.perf_counter() - start,
        )
        return graphs

    def _fitting_num_kv_blocks(self) -> int:
        budget = self.engine_config.kv_cache_memory_bytes
        if budget is not None:
            return budget_num_kv_blocks(
                self.model_config,
                budget,
                self.max_model_len,
                self.block_size,
                self.kv_cache_dtype,
                self.draft_config,
            )
        if self.device.type == "cpu":
            return cpu_num_kv_blocks(
                self.model_config,
                self.max_model_len,
                self.engine_config.max_num_seqs,
                self.block_size,
                self.kv_cache_dtype,
                draft=self.draft_config,
            )
        profile_peak_memory(
            self.model,
            self.model_config,
            self.engine_config,
            self.max_model_len,
            self.block_size,
            self.kv_cache_dtype,
            self.device,
            self.dtype,
        )
        return cuda_num_kv_blocks(
            self.model_config,
            self.block_size,
            self.kv_cache_dtype,
            self.engine_config.gpu_memory_utilization,
            self.device,
            self.draft_config,
        )
