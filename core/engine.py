"""The engine: one `step()` runs schedule → execute → update → detokenize → stop checks and
returns every request's delta for that iteration. `core` stays free of torch: the model runs
behind the `Executor` interface."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import cast

from baton.core.batch import Batch, ExecutorOutput, TokenLogprobs
from baton.core.config import EngineConfig
from baton.core.engine_stats import EngineStats
from baton.core.executor import Executor, KVTransfer
from baton.core.fault_isolation import run_each_alone
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
        )
        self.outputs = OutputProcessor(tokenizer, eos_token_ids, max_model_len)
        self.num_steps = 0
        # Requests to hand off at their next sampled token: prefill-only ones
        # (`add_request(hand_off=True)`) and those to migrate (`migrate`); and those handed
        # off whose blocks wait for the transfer to end (`release_prefilled`).
        self._to_hand_off: set[str] = set()
        self._handed_off: dict[str, Request] = {}
        # Bytes of KV one token holds in the executor's cache, for the transfer's size.
        self.kv_bytes_per_token: int = getattr(executor, "kv_bytes_per_token", 0)
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
            self._to_hand_off.add(request.request_id)
        return request

    def migrate(self, request_id: str) -> bool:
        """Hand a running request off at its next sampled token (a live migration): its output
        then carries a `PrefilledRequest` for another engine to go on decoding it, as a
        prefill-only request's first token does. False, changing nothing, for a request not
        here, not past its first token, or whose state lives outside its tokens: a grammar's
        matcher, or draft tokens under speculative decoding."""
        request = self.scheduler.requests.get(request_id)
        if (
            request is None
            or request.first_token_time is None
            or request.sampling_params.structured_output is not None
            or request.pooled is not None
            or self.speculator is not None
        ):
            return False
        self._to_hand_off.add(request_id)
        return True

    def add_prefilled(self, prefilled: PrefilledRequest, kv: object | None = None) -> Request:
        """Go on decoding a request another engine prefilled or migrated (its hand-off output),
        with the KV contents that engine's executor read (`read_prefilled_kv`); None when the
        executor needs none (a simulated one). Without room for it now it recomputes its
        tokens here."""
        spec = prefilled.request
        assert spec.arrival_time is not None, "a prefilled request keeps its arrival time"
        request = Request.admit(spec, spec.sampling_params, spec.arrival_time)
        request.token_ids.extend(prefilled.output_token_ids)
        request.num_computed_tokens = prefilled.num_computed_tokens
        request.first_scheduled_time = prefilled.first_scheduled_time
        request.first_token_time = prefilled.first_token_time
        # Paced from its landing: its next token is due one TPOT target after it, whatever the
        # transfer cost or its pace was on the other engine (`SLOPolicy.tpot_allowance_s`).
        num_behind = len(prefilled.output_token_ids) - 1
        target_s = 0.0 if spec.slo.tpot_ms is None else spec.slo.tpot_ms / 1000
        request.pace_start_time = self.clock() - target_s * num_behind
        request.num_cached_tokens = prefilled.num_cached_tokens
        request.num_preemptions = prefilled.num_preemptions
        request.token_times.extend(prefilled.token_times)
        request.prefill_chunks.extend(prefilled.prefill_chunks)
        if self.scheduler.add_prefilled(request, prefilled.block_hashes) and kv is not None:
            table = self.kv_cache.block_table(request.request_id)
            try:
                cast(KVTransfer, self.executor).write_kv(table, kv)
            except Exception:
                # A transfer that fails leaves nothing of the request here: its blocks go back.
                self.scheduler.finish_request(request, FinishReason.ERROR, self.clock())
                raise
        self.outputs.add(request)
        return request

    def read_prefilled_kv(self, request_id: str) -> object:
        """The KV contents of a handed-off request's computed tokens, read by the executor from
        the blocks it still holds."""
        return cast(KVTransfer, self.executor).read_kv(self.kv_cache.block_table(request_id))

    def release_prefilled(self, request_id: str) -> None:
        """The transfer of a handed-off request's KV has ended (or failed): free its blocks."""
        request = self._handed_off.pop(request_id, None)
        if request is not None:
            self.kv_cache.free(request)

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
            _record_prefill_chunks(batch, self.scheduler.requests, started, now)
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
            output = RequestOutput(request.request_id, [], "", request.num_prompt_tokens, 0)
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
        elif token_id is not None and request.request_id in self._to_hand_off:
            output.prefilled = self._hand_off(request)
        return output

    def _hand_off(self, request: Request) -> PrefilledRequest:
        """Stop serving a request at the token just sampled (its first, for a prefill-only one):
        its blocks stay held for the transfer, and the rest of it is the other engine's. The
        text held back for a stop string stays unsent: the other engine holds it back too."""
        self.scheduler.hand_off(request)
        self.outputs.remove(request.request_id)
        self._to_hand_off.discard(request.request_id)
        self._handed_off[request.request_id] = request
        assert request.first_scheduled_time is not None and request.first_token_time is not None
        spec = EngineRequest(
            request.request_id,
            request.prompt_token_ids,
            request.sampling_params,
            request.priority,
            request.slo,
            request.arrival_time,
            request.trace_context,
        )
        return PrefilledRequest(
            spec,
            tuple(request.token_ids[request.num_prompt_tokens :]),
            self.kv_cache.computed_block_hashes(request),
            request.num_computed_tokens * self.kv_bytes_per_token,
            request.first_scheduled_time,
            request.first_token_time,
            request.num_cached_tokens or 0,
            tuple(request.token_times),
            tuple(request.prefill_chunks),
            request.num_preemptions,
        )

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
        output = RequestOutput(
            request.request_id,
            [],
            "",
            request.num_prompt_tokens,
            request.num_output_tokens,
            error=INTERNAL_ERROR,
            error_detail=repr(error),
        )
        self._finish(request, output, FinishReason.ERROR, self.clock())
        return output

    def _finish(
        self, request: Request, output: RequestOutput, reason: FinishReason, now: float
    ) -> None:
        self.scheduler.finish_request(request, reason, now)
        self._to_hand_off.discard(request.request_id)
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
        output = RequestOutput(
            request.request_id, [], "", request.num_prompt_tokens, 0, error=message
        )
        self._finish(request, output, FinishReason.REFUSED, now)
        return output

    def _finish_early(
        self, request_id: str, reason: FinishReason, error: str | None
    ) -> RequestOutput | None:
        request = self.scheduler.requests.get(request_id)
        if request is None:
            self.release_prefilled(request_id)
            return None
        output = RequestOutput(
            request_id, [], "", request.num_prompt_tokens, request.num_output_tokens, error=error
        )
        self._finish(request, output, reason, self.clock())
        return output


def _record_prefill_chunks(
    batch: Batch, requests: dict[str, Request], started: float, finished: float
) -> None:
    # Prefill chunks follow the decodes in a batch, so the walk from the end stops once it has
    # seen all of the step's prefill tokens: steady decoding costs nothing here. A one-token
    # chunk past the prompt (a resumed request with all else cached) counts as a decode.
    remaining = batch.num_prefill_tokens
    for seq in reversed(batch.sequences):
        if remaining <= 0:
            break
        if len(seq.token_ids) == 1 and seq.start_position >= seq.num_prompt_tokens:
            continue
        requests[seq.request_id].prefill_chunks.append((started, finished, len(seq.token_ids)))
        remaining -= len(seq.token_ids)
