"""The offline Python API: build an engine for a checkpoint folder and generate, no server
(`LLM(path).generate(prompts, SamplingParams(...))`; README has an example).
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from baton.app.model_settings import ModelSettings
from baton.app.model_source import resolve_model
from baton.app.request_defaults import read_request_defaults
from baton.core.batch import TokenLogprobs
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.checkpoint.model_impl import resolve_model_config
from baton.core.config import EngineConfig
from baton.core.engine import Engine
from baton.core.executor import Executor
from baton.core.kv_cache.host_memory import release_freed_heap
from baton.core.outputs import RequestOutput, RequestTiming
from baton.core.request import EngineRequest, FinishReason
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.scheduling.step_cost_profile import profile_executor
from baton.core.simulation.simulated_executor import SimulatedExecutor
from baton.core.speculative.draft_model import resolve_draft_model
from baton.core.text.tokenizer import Tokenizer
from baton.kernels.cpu_threads import prefer_passive_waits

Prompt = str | list[int]


def build_engine(
    model: str | Path,
    config: EngineConfig,
    device: str = "auto",
    dtype: str = "auto",
    *,
    load_format: str = "auto",
    profile_step_cost: bool = False,
) -> Engine:
    """Load a Hugging Face checkpoint folder into a ready engine on `device`.

    `load_format="dummy"` gives random weights: `model` then needs only config.json and a
    tokenizer, or is a config file alone (a small tokenizer is made for it).
    `profile_step_cost` runs a few synthetic steps first to seed the step-cost model (a server
    wants its first scheduling decisions informed; offline runs learn as they go).

    The loading runs on a thread of its own that ends with it. Loading runs torch's large
    parallel ops (copies, quantizing, packing), and libgomp keeps an OpenMP thread pool for
    every thread that ran one, for as long as that thread lives. A pool left on the caller
    beside the step thread's makes libgomp count more threads than CPUs, and it then spins 100
    times instead of 300,000 before sleeping at a barrier: each parallel region of a decode
    step then ends in a futex sleep and a wake-up (docs/decisions.md).
    """
    return _on_own_thread(
        lambda: _load_engine(model, config, device, dtype, load_format, profile_step_cost)
    )


def _on_own_thread(build: Callable[[], Engine]) -> Engine:
    """`build()` on a thread that has ended when this returns; its exception, if any, raised
    here. A daemon, so an interrupt during a long load ends the process."""
    built: list[Engine] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            built.append(build())
        except BaseException as error:  # handed to the caller's thread, raised there
            failed.append(error)

    thread = threading.Thread(target=run, name="baton-load", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return built[0]


def _load_engine(
    model: str | Path,
    config: EngineConfig,
    device: str,
    dtype: str,
    load_format: str,
    profile_step_cost: bool,
) -> Engine:
    if load_format == "dummy" and Path(model).is_file():
        from baton.gpu.config_folder import write_config_folder

        model = write_config_folder(model, tempfile.mkdtemp(prefix="baton-dummy-"))
    # Before torch loads: a checkpoint that cannot be served fails in milliseconds.
    model_config = resolve_model_config(
        model, config.model_impl, needs_weights=load_format != "dummy"
    )
    draft_config = _draft_model_config(model_config, config, load_format)
    # As `baton serve` does; it takes effect only if torch has not loaded yet in this process.
    prefer_passive_waits()
    from baton.gpu.executor import TorchExecutor  # torch loads only when a model is actually built

    tokenizer = Tokenizer.from_pretrained(model)
    executor = TorchExecutor(
        model_config,
        config,
        device=device,
        dtype=dtype,
        load_format=load_format,
        draft_model_config=draft_config,
    )
    eos_token_ids = model_config.eos_token_ids or (
        [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    )
    engine = Engine(
        config,
        executor,
        max_model_len=executor.max_model_len,
        vocab_size=model_config.vocab_size,
        eos_token_ids=eos_token_ids,
        tokenizer=tokenizer,
        sliding_window=executor.model_config.freeable_window,
    )
    if profile_step_cost:
        profile_executor(
            engine.step_cost_model,
            executor,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            executor.max_model_len,
            model_config.vocab_size,
        )
        # The profile's steps freed their activations; glibc would keep those pages resident
        # for the server's whole life.
        release_freed_heap()
    return engine


def _draft_model_config(
    model_config: ModelConfig, config: EngineConfig, load_format: str
) -> ModelConfig | None:
    """The checked draft model of --speculative-method draft; None for other methods."""
    if config.speculative_method != "draft":
        return None
    if config.speculative_model is None:
        raise ValueError(
            "--speculative-method draft needs --speculative-model DIR, the draft model's "
            "checkpoint folder"
        )
    return resolve_draft_model(
        config.speculative_model,
        model_config,
        config.max_model_len or model_config.max_model_len,
        needs_weights=load_format != "dummy",
    )


def build_simulated_engine(
    tokenizer: Tokenizer,
    config: EngineConfig,
    executor: Executor | None = None,
    max_model_len: int = 8192,
) -> Engine:
    """An engine on the simulated executor (instant tokens unless the executor says otherwise)
    with a real tokenizer: for server tests and benchmarks where only the serving path should
    cost anything."""
    executor = executor or SimulatedExecutor(
        config.num_kv_blocks or 4096,
        config.block_size,
        tokenizer.vocab_size,
        cost=CostCoefficients(0.0, 0.0, 0.0, 0.0),
    )
    return Engine(
        config,
        executor,
        max_model_len=max_model_len,
        vocab_size=tokenizer.vocab_size,
        eos_token_ids=[tokenizer.eos_token_id],
        tokenizer=tokenizer,
    )


@dataclass(slots=True)
class GenerationResult:
    request_id: str
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    timing: RequestTiming | None = None
    error: str | None = None


class LLM:
    """Offline generation over continuous batching: all prompts are queued at once."""

    def __init__(
        self,
        model: str | Path,
        *,
        device: str = "auto",
        dtype: str = "auto",
        load_format: str = "auto",
        generation_config: str = "auto",
        chat_template: str | None = None,
        config: EngineConfig | None = None,
        **engine_config,
    ) -> None:
        """`model` as `--model` takes it (a checkpoint folder, a GGUF file or a hub id); `config`
        or keyword settings of EngineConfig (`max_num_seqs=8`, ...). `generation_config` and
        `chat_template` take what `baton serve`'s flags of those names take: the sampling
        defaults (auto: the checkpoint's generation_config.json; none; a folder), and a template
        file or text to use instead of the checkpoint's."""
        config = config or EngineConfig(**engine_config)
        folder = resolve_model(ModelSettings(model=str(model))).folder
        # Read before the weights, so a bad file fails before a long load.
        self.defaults = read_request_defaults(folder, generation_config, chat_template)
        self.engine = build_engine(folder, config, device, dtype, load_format=load_format)
        self.tokenizer = self.defaults.tokenizer_for(self.engine.tokenizer)
        self._next_id = 0

    def default_sampling_params(self) -> SamplingParams:
        """What `generate` samples with when given no params: SamplingParams' defaults with the
        checkpoint's recommended ones in their place (vLLM's `get_default_sampling_params`).
        Params passed to `generate` are taken whole, as given: a SamplingParams cannot tell a
        field left at its default from one set to that value."""
        return self.defaults.sampling.apply_to(SamplingParams())

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        on_output: Callable[[RequestOutput], None] | None = None,
    ) -> list[GenerationResult]:
        """Generate for each prompt (text or token ids); results come back in prompt order.
        No `params`: `default_sampling_params()` for every prompt.

        `on_output` sees every per-step delta as it is produced, for streaming.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or self.default_sampling_params()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        requests = []
        for prompt, request_params in zip(prompts, params, strict=True):
            token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            request = EngineRequest(f"offline-{self._next_id}", token_ids, request_params)
            self._next_id += 1
            # All checked before any is queued: a refusal leaves the engine as it was.
            requests.append(self.engine.validator.validate(request))
        results: dict[str, GenerationResult] = {}
        for request in requests:
            self.engine.add_request(request)
            results[request.request_id] = GenerationResult(
                request.request_id, request.prompt_token_ids
            )
        while self.engine.has_unfinished_requests:
            for output in self.engine.step():
                _accumulate(results[output.request_id], output)
                if on_output is not None:
                    on_output(output)
        return list(results.values())

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> GenerationResult:
        """One chat turn through the checkpoint's chat template."""
        return self.generate([self.tokenizer.encode_chat(messages)], params)[0]


def _accumulate(result: GenerationResult, output: RequestOutput) -> None:
    result.text += output.new_text
    result.token_ids.extend(output.new_token_ids)
    if output.logprobs:
        result.logprobs.extend(output.logprobs)
    if output.prompt_logprobs is not None:
        result.prompt_logprobs = output.prompt_logprobs
    if output.finished:
        result.finish_reason = output.finish_reason
        result.timing = output.timing
        result.error = output.error
