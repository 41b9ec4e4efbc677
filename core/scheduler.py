"""The scheduler mechanism: per step, fill a token budget with running decodes first, then
prefill chunks of partly-prefilled and waiting requests; preempt by recompute when KV blocks run
out. Which request goes first, how much prefill a step carries and whom to preempt are the
policy's decisions."""

from __future__ import annotations

from core.batch import Batch, ExecutorOutput, ScheduledSequence, TokenLogprobs
from core.kv_cache_manager import KVCacheManager
from core.policy import SchedulingPolicy
from core.request import FinishReason, Request, RequestStatus


class Scheduler:
    def __init__(
        self,
        kv_cache: KVCacheManager,
        policy: SchedulingPolicy,
        max_num_seqs: int,
        max_num_batched_tokens: int,
    ) -> None:
        self.kv_cache = kv_cache
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        # Requests holding a place in the batch being built: not candidates for preemption.
        self._scheduled: set[str] = set()
        self.num_preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_request(self, request: Request, reason: FinishReason, now: float) -> None:
        """Take a request out of the queues for good and free its blocks at once."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is not RequestStatus.FINISHED:
            self.waiting.remove(request)
        self.kv_cache.free(request)
        del self.requests[request.request_id]
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = now

    def schedule(self, now: float) -> Batch:
        batch = Batch()
        self._scheduled = set()
        token_budget = self.max_num_batched_tokens
        decodes: list[Request] = []
        prefills: list[Request] = []
        for request in self.running:
            is_decode = len(request.token_ids) - request.num_computed_tokens == 1
            (decodes if is_decode else prefills).append(request)
        preempted = False

        for request in decodes:
            if token_budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted to make room for an earlier decode
            if self._reserve(request, 1, now):
                self._add(batch, request, 1)
                token_budget -= 1
            else:
                preempted = True

        prefill_budget = self.policy.prefill_budget(self.running, token_budget, now)
        # Partly-prefilled and waiting requests compete for the prefill budget in one order, the
        # policy's; after a preemption the pool is known to be short, and admitting more would
        # only thrash. Ordering a long queue costs a sort per step: skip it when nothing fits.
        admitting = (
            not preempted
            and bool(self.waiting)
            and prefill_budget > 0
            and len(self.running) < self.max_num_seqs
        )
        candidates = prefills + self.waiting if admitting else prefills
        admitted: set[str] = set()
        for request in self.policy.order_waiting(candidates, now):
            if prefill_budget <= 0:
                break
            if request.request_id in admitted:
                continue
            if request.status is RequestStatus.RUNNING:
                start = request.num_computed_tokens
                overhead = self.policy.chunk_overhead(request, start)
                num_new = min(request.num_tokens - start, prefill_budget - overhead)
                if num_new <= 0:
                    continue
                if self._reserve(request, num_new, now):
                    self._add(batch, request, num_new)
                    prefill_budget -= num_new + overhead
                else:
                    preempted, admitting = True, False
            elif admitting and not preempted and len(self.running) < self.max_num_seqs:
                used = self._admit(batch, request, prefill_budget, now)
                if used is None:
                    admitting = False
                elif used:
                    admitted.add(request.request_id)
                    prefill_budget -= used
        if admitted:
            self.waiting = [r for r in self.waiting if r.request_id not in admitted]
        return batch

    def update(
        self, batch: Batch, output: ExecutorOutput
    ) -> list[tuple[Request, int, TokenLogprobs | None]]:
        """Advance each scheduled request past this step's tokens; return the sampled tokens."""
        sampled = []
        index = 0
        for seq in batch.sequences:
            request = self.requests[seq.request_id]
            request.num_computed_tokens += len(seq.token_ids)
            self.kv_cache.cache_computed_blocks(request)
            if seq.sample:
                token_id = output.sampled_token_ids[index]
                logprobs = output.logprobs[index] if output.logprobs else None
                index += 1
                request.append_token(token_id)
                sampled.append((request, token_id, logprobs))
        return sampled

    def _admit(self, batch: Batch, request: Request, prefill_budget: int, now: float) -> int | None:
        """Start prefilling a waiting request; the budget it used (0: no room for a chunk of
        it), or None if blocks ran out."""
        prefix = self.kv_cache.cached_prefix(request)
        num_hit = len(prefix) * self.kv_cache.block_size
        overhead = self.policy.chunk_overhead(request, num_hit)
        num_new = min(request.num_tokens - num_hit, prefill_budget - overhead)
        if num_new <= 0:
            return 0
        if not self.kv_cache.allocate_slots(request, num_new, prefix):
            return None
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
        self._add(batch, request, num_new)
        return num_new + overhead

    def _reserve(self, request: Request, num_new: int, now: float) -> bool:
        """Get blocks for a running request, preempting others (or itself) until they fit."""
        while not self.kv_cache.allocate_slots(request, num_new):
            candidates = [r for r in self.running if r.request_id not in self._scheduled]
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
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(request)

    def _add(self, batch: Batch, request: Request, num_new: int) -> None:
        start = request.num_computed_tokens
        end = start + num_new
        token_ids = request.token_ids
        batch.sequences.append(
            ScheduledSequence(
                request.request_id,
                token_ids[start:end],
                start,
                self.kv_cache.block_table(request.request_id),
                end == len(token_ids),
                request.sampling_params,
                token_ids,
                request.num_prompt_tokens,
            )
        )
        self._scheduled.add(request.request_id)
        if num_new == 1 and start >= request.num_prompt_tokens:
            batch.num_decode_tokens += 1
        else:
            batch.num_prefill_tokens += num_new
