"""The engine: one `step()` runs schedule → execute → update → detokenize → stop checks and
returns every request's delta for that iteration. `core` stays free of torch: the model runs
behind the `Executor` interface."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable

from baton.core.batch import Batch, ExecutorOutput, TokenLogprobs
from baton.core.config import EngineConfig
from baton.core.engine_stats import EngineStats
from baton.core.executor import Executor
from baton.core.fault_isolation import run_each_alone
from baton.core.hand_off import HandOffs
from baton.core.kv_cache.kv_cache_manager import KVCacheManager
from baton.core.outputs import RequestOutput, RequestTiming
from baton.core.prefilled import PrefilledRequest
from baton.core.request import EngineRequest, FinishReason, Request
from baton.core.request_validator import ModelLimits, RequestValidator
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from baton.core.scheduling.length_predictor import LengthPredictor
from baton.core.scheduling.lifetime import LifetimeMean
from baton.core.scheduling.policy import PolicyContext
from baton.core.scheduling.policy_registry import make_policy
from baton.core.scheduling.scheduler import Scheduler
from baton.core.scheduling.step_cost import StepCostModel
from baton.core.speculative.proposer import make_proposer
from baton.core.speculative.speculator import Speculator
from baton.core.step_stats import StepStats
from baton.core.structured_output import GrammarCompiler
from baton.core.text.output_processor import OutputProcessor
from baton.core.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
# What a client is told when its request failed inside the engine; the details are logged.
INTERNAL_ERROR = "internal error while serving this request; the server log has the details"


class Engine:
    """Continuous batching over one executor. Not thread-safe: one thread drives it."""

    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        *,
        max_model_len: int,
        vocab_size: int,
        eos_token_ids: list[int],
        tokenizer: Tokenizer | None = None,
        clock: Callable[[], float] = time.monotonic,
        sliding_window: int | None = None,
    ) -> None:
        self.config = config
        self.executor = executor
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.clock = clock
        self.tokenizer = tokenizer
        # `sliding_window`: the model's window when every layer has one (KV blocks behind it
        # are freed as requests grow); None when any layer attends to everything.
        self.kv_cache = KVCacheManager(
            executor.num_kv_blocks,
            executor.block_size,
            config.enable_prefix_caching,
            sliding_window,
        )
        self.limits = ModelLimits(
            max_model_len, vocab_size, executor.num_kv_blocks, executor.block_size, sliding_window
        )
        # What every caller runs on a request before `add_request`: admission, `LLM`, the
        # simulator. Pure, so the front end runs it on the event loop.
        self.validator = RequestValidator(config, self.limits)
        # All learn online, in the step thread: step durations from every step, output lengths
        # and lifetimes from every request that finishes. Policies read them; metrics report
        # their error; admission reads the published cost fit and lifetime.
        self.step_cost_model = StepCostModel()
        self.length_predictor = LengthPredictor()
        self.lifetime = LifetimeMean()
        self.policy_context = PolicyContext(
            self.step_cost_model,
            self.length_predictor,
            config.max_wait_ms / 1000,
            config.max_num_batched_tokens,
            config.max_num_seqs,
            self.lifetime,
            config.slo_admission_factor,
        )
        self.speculator = (
            Speculator(
                make_proposer(config),
                config.num_speculative_tokens,
                self.step_cost_model,
            )
            if config.speculates
            else None
        )
        self.scheduler = Scheduler(
            self.kv_cache,
            make_policy(config.scheduling_policy, self.policy_context),
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.max_wait_ms / 1000,
            config.max_preemptions,
            self.speculator,
            config.kv_growth_forecast,
        )
        self.outputs = OutputProcessor(tokenizer, eos_token_ids, max_model_len)
        self.hand_offs = HandOffs(
            self.scheduler,
            self.kv_cache,
            executor,
            self.outputs,
            clock,
            speculates=self.speculator is not None,
            kv_bytes_per_token=getattr(executor, "kv_bytes_per_token", 0),
        )
        self.num_steps = 0
        # Called in the step thread: after every step that ran a batch, and for every request
        # as it finishes (with its final output). Listeners must be quick and must not raise.
        self.step_listeners: list[Callable[[StepStats], None]] = [self.step_cost_model.observe]
        if self.speculator is not None:
            # Before the fit learns the step: the drafts' cost is measured against its old self.
            self.step_listeners.insert(0, self.speculator.observe_step)
        self.finish_listeners: list[Callable[[Request, RequestOutput], None]] = [
            lambda request, _output: self.length_predictor.observe(request),
            lambda request, _output: self.lifetime.observe(request),
        ]

    @property
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def make_stats(self) -> EngineStats:
        """A snapshot of the queues, the cache and the counters, for the step loop to publish."""
        scheduler = self.scheduler
        by_priority = Counter(request.priority for request in scheduler.waiting)
        cost = self.step_cost_model
        # Read only once built: building it reads the vocabulary.
        grammars: GrammarCompiler | None = getattr(self.executor, "built_grammar_compiler", None)
        return EngineStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            waiting_by_priority=tuple(sorted(by_priority.items())),
            kv_cache_usage=self.kv_cache.usage,
            num_steps=self.num_steps,
            num_preemptions=scheduler.num_preemptions,
            num_kv_growth_holds=scheduler.num_kv_growth_holds,
            prefix_cache_queries=scheduler.prefix_cache_queries,
            prefix_cache_hits=scheduler.prefix_cache_hits,
            kv_blocks_freed_by_window=self.kv_cache.num_window_freed_blocks,
            step_cost=cost.current,
            step_cost_error=cost.mean_abs_error_ratio,
            step_cost_observations=cost.num_observations,
            mean_lifetime_s=self.lifetime.mean_s,
            grammar_cache_entries=grammars.num_cached if grammars is not None else 0,
            grammar_cache_bytes=grammars.cached_bytes if grammars is not None else 0,
            spec_decode=None if self.speculator is None else self.speculator.counters.snapshot(),
        )

    def compile_structured_output(self, params: SamplingParams) -> SamplingParams:
        """`params` with its output constraint compiled by the executor (a no-op without one,
        or when already compiled). Slow for a new schema and thread-safe: the server calls it
        on a worker thread before submitting, so the step thread never waits for a compile."""
        constraint = params.structured_output
        if constraint is None or constraint.grammar is not None:
            return params
        compiler: GrammarCompiler | None = getattr(self.executor, "grammar_compiler", None)
        if compiler is None:
            raise InvalidRequestError(
                f"{constraint.param} asks for structured output, which this engine's executor "
                "does not support; leave it out",
                constraint.param,
            )
        return dataclasses.replace(params, structured_output=compiler.compile(constraint))

    def add_request(self, spec: EngineRequest, *, hand_off: bool = False) -> Request:
        """Queue a request that `validator` has passed (admission, `LLM`, the simulator): the
        engine checks nothing twice. Raises InvalidRequestError only for an output constraint
        this executor cannot compile. With `hand_off`, the engine only prefills it: the output
        with its first token carries a `PrefilledRequest` for another engine to decode it,
        unless that token already ends it."""
        # The invariants validation leaves, cheap to assert: an unvalidated request is a bug in
        # its caller, caught here rather than as a request that never finishes.
        max_tokens = spec.sampling_params.max_tokens
        num_tokens = len(spec.prompt_token_ids) + (max_tokens or 0)
        assert max_tokens is not None and num_tokens <= self.max_model_len, (
            f"request {spec.request_id} was not validated (RequestValidator.validate)"
        )
        params = self.compile_structured_output(spec.sampling_params)
        arrival = self.clock() if spec.arrival_time is None else spec.arrival_time
        request = Request.admit(spec, params, arrival)
        self.scheduler.add_request(request)
        self.outputs.add(request)
        if hand_off:
            self.hand_offs.at_first_token(request.request_id)
        return request

    def migrate(self, request_id: str) -> bool:
        """Hand a running request off at its next sampled token (`HandOffs.migrate`)."""
        return self.hand_offs.migrate(request_id)

    def add_prefilled(self, prefilled: PrefilledRequest, kv: object | None = None) -> Request:
        """Go on decoding a request another engine handed off (`HandOffs.add_prefilled`)."""
        return self.hand_offs.add_prefilled(prefilled, kv)

    def read_prefilled_kv(self, request_id: str) -> object:
        """The KV contents of a handed-off request's computed tokens, for the transfer."""
        return self.hand_offs.read_kv(request_id)

    def release_prefilled(self, request_id: str) -> None:
        """The transfer of a handed-off request's KV has ended (or failed): free its blocks."""
        self.hand_offs.release(request_id)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Cancel a request; its KV blocks are free before the next step."""
        return self._finish_early(request_id, FinishReason.CANCELLED, None)

    def fail_request(self, request_id: str, error: str) -> RequestOutput | None:
        return self._finish_early(request_id, FinishReason.ERROR, error)

    def step(self) -> list[RequestOutput]:
        started = self.clock()
        refused = [self._refuse(request, started) for request in self.scheduler.refused(started)]
        batch = self.scheduler.schedule(started)
        if not batch.sequences:
            return refused
        num_context_tokens = sum(sequence.seq_len for sequence in batch.sequences)
        scheduled = batch
        failed: list[RequestOutput] = []
        try:
            result = self.executor.execute(batch)
        except Exception as error:
            batch, result, failed = self._isolate_fault(batch, error)
        sampled = self.scheduler.update(batch, result)
        now = self.clock()
        self.num_steps += 1
        if batch.num_prefill_tokens:
            for seq in batch.prefill_chunks():
                chunk = (started, now, len(seq.token_ids))
                self.scheduler.requests[seq.request_id].prefill_chunks.append(chunk)
        outputs = refused + failed
        for request, token_ids, logprobs in sampled:
            try:
                outputs.append(self._process(request, token_ids, logprobs, now))
            except Exception as error:
                logger.exception("output processing failed for request %s", request.request_id)
                outputs.append(self._fail(request, error))
        if self.step_listeners:
            stats = StepStats(
                started=started,
                executed=now,
                finished=self.clock(),
                num_seqs=len(scheduled),
                num_prefill_tokens=scheduled.num_prefill_tokens,
                num_decode_tokens=scheduled.num_decode_tokens,
                num_context_tokens=num_context_tokens,
                num_draft_tokens=scheduled.num_draft_tokens,
                num_constrained_rows=scheduled.num_constrained_rows,
            )
            for listener in self.step_listeners:
                listener(stats)
        return outputs

    def _process(
        self,
        request: Request,
        token_ids: list[int],
        logprobs: list[TokenLogprobs | None] | None,
        now: float,
    ) -> RequestOutput:
        """The output for the tokens a step just appended to `request` (more than one when
        draft tokens were accepted), cut at the first that finishes it; or, with no tokens, for
        a request with `max_tokens` 0 whose prompt has just been computed: it finishes with
        nothing generated."""
        first = request.first_token_time is None
        if first:
            request.first_token_time = now
        finish_reason: FinishReason | None = None
        if not token_ids:
            output = RequestOutput.without_tokens(request)
            if request.pooled is not None:
                output.embedding = request.pooled.embedding()
            finish_reason = FinishReason.LENGTH
        else:
            # Stops are checked token by token, so the request holds each only as it is checked.
            del request.token_ids[len(request.token_ids) - len(token_ids) :]
            texts = []
            for token_id in token_ids:
                request.append_token(token_id)
                request.token_times.append(now)
                text, finish_reason = self.outputs.process(request, token_id)
                texts.append(text)
                if finish_reason is not None:
                    break
            kept = token_ids[: len(texts)]
            output = RequestOutput(
                request.request_id,
                kept,
                "".join(texts),
                request.num_prompt_tokens,
                request.num_output_tokens,
            )
            if logprobs is not None:
                output.logprobs = logprobs[: len(kept)]
        if first:
            # Complete once the first token is sampled: the prompt is computed by then.
            output.prompt_logprobs = request.prompt_logprobs
        if finish_reason is not None:
            self._finish(request, output, finish_reason, now)
        elif token_id is not None and self.hand_offs.is_due(request.request_id):
            output.prefilled = self.hand_offs.hand_off(request)
        return output

    def _isolate_fault(
        self, batch: Batch, error: Exception
    ) -> tuple[Batch, ExecutorOutput, list[RequestOutput]]:
        logger.warning("step of %d sequences failed (%s); isolating the fault", len(batch), error)
        step = run_each_alone(self.executor, batch)
        requests = self.scheduler.requests
        failed = [self._fail(requests[seq.request_id], exc) for seq, exc in step.failures]
        return step.batch, step.output, failed

    def _fail(self, request: Request, error: Exception) -> RequestOutput:
        # The exception's text stays in the log: it can carry paths and internals.
        logger.error("request %s failed: %r", request.request_id, error)
        output = RequestOutput.without_tokens(request, INTERNAL_ERROR, repr(error))
        self._finish(request, output, FinishReason.ERROR, self.clock())
        return output

    def _finish(
        self, request: Request, output: RequestOutput, reason: FinishReason, now: float
    ) -> None:
        self.scheduler.finish_request(request, reason, now)
        self.hand_offs.discard(request.request_id)
        output.new_text += self.outputs.remove(request.request_id)
        output.finished = True
        output.finish_reason = reason
        output.timing = RequestTiming.of(request)
        output.token_times = request.token_times
        for listener in self.finish_listeners:
            listener(request, output)

    def _refuse(self, request: Request, now: float) -> RequestOutput:
        factor = self.config.slo_admission_factor
        waited_ms = (now - request.arrival_time) * 1000
        message = (
            f"the server is overloaded: this request waited {waited_ms:.0f} ms without starting, "
            f"past {factor:g} times its TTFT target of {request.slo.ttft_ms:g} ms; retry later "
            "or send a looser slo.ttft_ms"
        )
        output = RequestOutput.without_tokens(request, message)
        self._finish(request, output, FinishReason.REFUSED, now)
        return output

    def _finish_early(
        self, request_id: str, reason: FinishReason, error: str | None
    ) -> RequestOutput | None:
        request = self.scheduler.requests.get(request_id)
        if request is None:
            self.release_prefilled(request_id)
            return None
        output = RequestOutput.without_tokens(request, error)
        self._finish(request, output, reason, self.clock())
        return output
