"""The scheduler mechanism: per step, fill a token budget with running decodes first, then
prefill chunks of partly-prefilled and waiting requests; preempt by recompute when KV blocks run
out; take the step's output back (core/scheduling/update_from_output.py). Which request goes
first, how much prefill a step carries and whom to preempt are the policy's decisions, within
two hard bounds every policy keeps: no request waits longer than `max_wait_s` for its first
token (core/scheduling/starvation_bound.py), and no request is preempted more than
`max_preemptions` times. Static batching is the exception to the first (its batch is closed)
and never preempts: each slot reserves its maximum length of KV when the batch forms
(core/scheduling/static_batch.py)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from baton.core.batch import Batch, ExecutorOutput, ScheduledSequence
from baton.core.kv_cache.kv_cache_manager import KVCacheManager
from baton.core.pooling import Pooling
from baton.core.request import FinishReason, Request, RequestStatus
from baton.core.scheduling.kv_growth import GrowthForecast, GrowthRoom
from baton.core.scheduling.policy import UNLIMITED, SchedulerView, SchedulingPolicy, StepPlan
from baton.core.scheduling.starvation_bound import StarvationBound
from baton.core.scheduling.static_batch import StaticBatch, reserved_tokens
from baton.core.scheduling.update_from_output import SampledTokens, update_from_output
from baton.core.speculative.speculator import Speculator

NO_POSITIONS = range(0)
# No draft tokens, and none accepted: shared, never appended to.
NO_TOKENS: list[int] = []


class Scheduler:
    def __init__(
        self,
        kv_cache: KVCacheManager,
        policy: SchedulingPolicy,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_wait_s: float = math.inf,
        max_preemptions: int = 3,
        speculator: Speculator | None = None,
        kv_growth_forecast: bool = True,
    ) -> None:
        self.kv_cache = kv_cache
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # A static batch is closed, also to a request past the starvation bound.
        self.max_wait_s = math.inf if policy.static_batching else max_wait_s
        self.max_preemptions = max_preemptions
        self.bound = StarvationBound(
            policy.context,
            kv_cache,
            self.max_wait_s,
            max_num_seqs,
            max_num_batched_tokens,
            max_preemptions,
        )
        self.growth = (
            GrowthForecast(kv_cache, policy.context.length_predictor)
            if policy.leaves_kv_growth_room and kv_growth_forecast
            else None
        )
        # The step's view of the running requests' growth, taken at its first admission.
        self._room: GrowthRoom | None = None
        # Speculative decoding; never under static batching, whose slots step in lockstep.
        self.speculator = None if policy.static_batching else speculator
        # In arrival order, so the requests nearest the starvation bound are at the front.
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        # Requests holding a place in the batch being built: not candidates for preemption.
        self._scheduled: set[str] = set()
        # Hashes of the first uncached block of each prompt admitted in the step being built.
        self._blocks_in_flight: set[bytes] = set()
        # Ended since the last batch; the next batch tells the executor (Batch docstring).
        self._finished_ids: list[str] = []
        # Under static batching, the batch running: each step's padding is measured by it.
        self._static_batch: StaticBatch | None = None
        self.num_preemptions = 0
        self.num_kv_growth_holds = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self._enqueue(request)

    def finish_request(self, request: Request, reason: FinishReason, now: float) -> None:
        """Take a request out of the queues for good and free its blocks at once."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is not RequestStatus.FINISHED:
            self.waiting.remove(request)
        self.kv_cache.free(request)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = now

    def hand_off(self, request: Request) -> None:
        """Take a running request whose first token was just sampled out of the queues: its
        decoding goes on in another engine. Its blocks stay held, for the transfer to read,
        until the engine releases them (`KVCacheManager.free`)."""
        self.running.remove(request)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)
        request.status = RequestStatus.HANDED_OFF

    def add_prefilled(self, request: Request, block_hashes: Sequence[bytes]) -> bool:
        """Start decoding a request whose prompt another engine computed: it runs at once with
        its prompt's KV in fresh blocks. Without a place or the blocks for it, it queues as a
        preempted request does and recomputes its prompt (False)."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        if len(self.running) < self.max_num_seqs and self.kv_cache.allocate_prefilled(
            request, block_hashes
        ):
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            return True
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self._enqueue(request)
        return False

    def refused(self, now: float) -> list[Request]:
        """Queued requests the policy refuses now; the caller finishes them."""
        return self.policy.refuse(self.waiting, now) if self.waiting else []

    def schedule(self, now: float) -> Batch:
        batch = Batch()
        self._scheduled = set()
        self._blocks_in_flight = set()
        self._room = None
        token_budget = self.max_num_batched_tokens
        overdue = self.bound.overdue(self.waiting, self.running, now)
        preempted = self.bound.make_room(overdue, self.running, now, self._preempt)
        decodes: list[Request] = []
        prefills: list[Request] = []
        for request in self.running:
            is_decode = request.num_uncomputed_tokens == 1
            (decodes if is_decode else prefills).append(request)

        # Without speculation, "none" repeated endlessly: no list per decode.
        drafts = (
            itertools.repeat(NO_TOKENS)
            if self.speculator is None or not decodes
            else self.speculator.drafts_beside(
                decodes, itertools.chain(prefills, self.waiting), token_budget
            )
        )
        for request, draft in zip(decodes, drafts, strict=False):
            if token_budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted to make room for an earlier decode
            # Draft tokens take only free blocks: no request is preempted for a guess.
            if draft and self.kv_cache.allocate_slots(request, 1 + len(draft)):
                self._add(batch, request, 1, draft)
                token_budget -= 1 + len(draft)
            elif self._reserve(request, 1, now):
                self._add(batch, request, 1)
                token_budget -= 1
            else:
                preempted = True

        # Partly-prefilled and waiting requests compete for the prefill budget in one order, the
        # policy's; after a preemption for blocks the pool is known to be short, and admitting
        # more would only thrash (an overdue request is admitted all the same).
        admitting = bool(self.waiting) and len(self.running) < self.max_num_seqs
        candidates = prefills + self.waiting if admitting and not preempted else prefills
        admitted: set[str] = set()
        if candidates or overdue:  # else no prefill to plan: a steady decode step
            view = SchedulerView(now, tuple(candidates), tuple(self.running), token_budget)
            plan = self.policy.plan(view)
            admitted = self._schedule_prefills(
                batch, view, plan, overdue, admitting and not preempted
            )
        if admitted:
            self.waiting = [r for r in self.waiting if r.request_id not in admitted]
        if not batch.sequences and self.running:
            # Every running request is protected and none can grow: break the stall.
            self._preempt(self.policy.choose_victim(self.running, now), now)
        if batch.sequences:  # an empty batch never reaches the executor; the ids wait
            batch.finished_request_ids, self._finished_ids = self._finished_ids, []
            if self.policy.static_batching:
                self._pad(batch)
        return batch

    def _schedule_prefills(
        self,
        batch: Batch,
        view: SchedulerView,
        plan: StepPlan,
        overdue: list[Request],
        admitting: bool,
    ) -> set[str]:
        """Add prefill chunks in the plan's order within its budget; the ids of the waiting
        requests admitted. `admitting`: whether waiting requests may start (overdue ones may)."""
        now = view.now
        prefill_budget = plan.prefill_budget
        order = plan.order
        if overdue:
            # The bound outranks the policy: the overdue go first, with the whole budget.
            prefill_budget = max(prefill_budget, view.token_budget)
            first = {request.request_id for request in overdue}
            order = overdue + [r for r in order if r.request_id not in first]
            if not plan.order:
                order += [r for r in view.waiting if r.request_id not in first]
        admitted: set[str] = set()
        for request in order:
            if prefill_budget <= 0:
                break
            if request.request_id in self._scheduled:
                # Once a step: an overdue request on its last prompt token rode along as a
                # decode already, and the order may name a request twice.
                continue
            overhead = math.ceil(plan.context_weight * request.num_computed_tokens)
            if request.status is RequestStatus.RUNNING:
                start = request.num_computed_tokens
                num_new = min(request.num_tokens - start, prefill_budget - overhead)
                if num_new <= 0:
                    continue
                if self._reserve(request, num_new, now):
                    self._add(batch, request, num_new)
                    prefill_budget -= num_new + overhead
                else:
                    admitting = False
            elif len(self.running) < self.max_num_seqs and (admitting or request in overdue):
                # Without a prefill limit (static batching forming its batch) everyone starts
                # now: a request held back would wait for the whole batch to drain.
                is_overdue = request in overdue
                may_wait = plan.prefill_budget < UNLIMITED and not is_overdue
                used = self._admit(
                    batch, request, prefill_budget, plan.context_weight, now, may_wait, is_overdue
                )
                if used is None:
                    admitting = False
                elif used:
                    admitted.add(request.request_id)
                    prefill_budget -= used
        return admitted

    def _pad(self, batch: Batch) -> None:
        """Charge a static batch's step its padding; the step that forms the batch (the only one
        that prefills: its prompts go whole) records the batch's shape."""
        if batch.num_prefill_tokens:
            self._static_batch = StaticBatch.of(self.running)
        assert self._static_batch is not None, "a static batch decodes only once it has formed"
        batch.padding = self._static_batch.padding(batch)

    def update(self, batch: Batch, output: ExecutorOutput) -> list[SampledTokens]:
        """Apply a step's output to the requests it scheduled (`update_from_output`)."""
        return update_from_output(batch, output, self.requests, self.kv_cache, self.speculator)

    def _admit(
        self,
        batch: Batch,
        request: Request,
        prefill_budget: int,
        context_weight: float,
        now: float,
        may_wait: bool = False,
        overdue: bool = False,
    ) -> int | None:
        """Start prefilling a waiting request; the budget it used (0: no room for a chunk of
        it, or, if it `may_wait`, its prefix is being computed for another request this step),
        or None if blocks ran out or the policy's KV growth forecast holds it back (never an
        `overdue` one)."""
        prefix = self.kv_cache.usable_prefix(request)
        scored_from = request.prompt_logprobs_from
        # Requests sharing a prompt (the choices of `n`) arrive together: the first computes
        # it and the others wait a step to read it from the cache rather than compute it too.
        first_new = (
            request.block_hashes[len(prefix)]
            if len(request.block_hashes) > len(prefix)
            and scored_from is None
            and request.sampling_params.pooling is not Pooling.MEAN
            else None
        )
        if may_wait and first_new is not None and first_new in self._blocks_in_flight:
            return 0
        num_hit = len(prefix) * self.kv_cache.block_size
        overhead = math.ceil(context_weight * num_hit)
        num_new = min(request.num_tokens - num_hit, prefill_budget - overhead)
        if num_new <= 0:
            return 0
        forecasting = self.growth is not None and self.growth.ready
        # Prefix blocks a running request holds already are not the newcomer's to grow.
        shared = sum(1 for block in prefix if block.ref_count > 0) if forecasting else 0
        if forecasting and not overdue:
            if self._room is None:
                self._room = self.growth.room(self.running)
            if not self._room.admits(request, shared):
                self.num_kv_growth_holds += 1
                return None
        # A static slot holds KV for its longest possible answer from the start (so fewer fit).
        num_held = reserved_tokens(request) - num_hit if self.policy.static_batching else num_new
        if not self.kv_cache.allocate_slots(request, num_held, prefix):
            return None
        if first_new is not None:
            self._blocks_in_flight.add(first_new)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_hit
            request.first_scheduled_time = now
        else:
            request.resumed_times.append(now)
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_hit
        self.running.append(request)
        if self._room is not None:
            self._room.add(request, shared)
        self._add(batch, request, num_new)
        return num_new + overhead

    def _reserve(self, request: Request, num_new: int, now: float) -> bool:
        """Get blocks for a running request, preempting others (or itself) until they fit."""
        while not self.kv_cache.allocate_slots(request, num_new):
            candidates = [
                r
                for r in self.running
                if r.request_id not in self._scheduled
                and r.num_preemptions < self.max_preemptions
                and r is not request
            ]
            if request.num_preemptions < self.max_preemptions:
                candidates.append(request)
            elif not candidates:
                return False  # protected, and nobody else may go: it waits for blocks
            victim = self.policy.choose_victim(candidates, now)
            self._preempt(victim, now)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request, now: float) -> None:
        self.running.remove(request)
        request.preempted_times.append(now)
        self.kv_cache.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        if request.pooled is not None:
            request.pooled.reset()
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(request)

    def _enqueue(self, request: Request) -> None:
        bisect.insort(self.waiting, request, key=lambda r: r.arrival_time)

    def _add(
        self, batch: Batch, request: Request, num_new: int, draft: list[int] | None = None
    ) -> None:
        start = request.num_computed_tokens
        end = start + num_new
        token_ids = request.token_ids
        scored = NO_POSITIONS
        # Tested first inline: this runs for every decode of every step.
        if request.prompt_logprobs is not None:
            scored_from = request.prompt_logprobs_from
            if scored_from is not None:
                scored = range(max(start, scored_from), min(end, request.num_prompt_tokens - 1))
                batch.num_prompt_logprobs += len(scored)
        seq = ScheduledSequence(
            request.request_id,
            token_ids[start:end],
            start,
            self.kv_cache.block_table(request.request_id),
            end == len(token_ids) and request.sampling_params.max_tokens != 0,
            request.sampling_params,
            token_ids,
            request.num_prompt_tokens,
            scored,
        )
        if draft:
            seq.token_ids.extend(draft)
            seq.draft_token_ids = draft
            batch.num_draft_tokens += len(draft)
        if seq.sample and request.sampling_params.structured_output is not None:
            batch.num_constrained_rows += 1 + len(seq.draft_token_ids)
        batch.sequences.append(seq)
        batch.num_pooled += seq.pools
        self._scheduled.add(request.request_id)
        if num_new == 1 and start >= request.num_prompt_tokens:
            batch.num_decode_tokens += 1
        else:
            batch.num_prefill_tokens += num_new
