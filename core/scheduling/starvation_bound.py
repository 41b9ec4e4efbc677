"""The bound every policy keeps: no request waits longer than `max_wait_s` for its first token.
A waiting request about to pass it is overdue: it is served first and, when the batch has no
place or the pool no blocks for its first chunk, takes the place of the running request whose
preemption costs least against its own SLO."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from baton.core.kv_cache.kv_cache_manager import KVCacheManager
from baton.core.request import Request, RequestStatus
from baton.core.scheduling import feasibility
from baton.core.scheduling.policy import PolicyContext


class StarvationBound:
    def __init__(
        self,
        context: PolicyContext,
        kv_cache: KVCacheManager,
        max_wait_s: float,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_preemptions: int,
    ) -> None:
        self.context = context
        self.kv_cache = kv_cache
        self.max_wait_s = max_wait_s
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_preemptions = max_preemptions

    def overdue(self, waiting: list[Request], running: list[Request], now: float) -> list[Request]:
        """Requests owing their first token that must start now to keep the bound; `waiting`
        in arrival order."""
        earliest = now - feasibility.BOUND_EARLIEST_SHARE * self.max_wait_s
        if not waiting or waiting[0].arrival_time > earliest:
            return []
        # Partly prefilled requests still owe their first token too.
        prefilling = sorted(
            (r for r in running if r.first_token_time is None), key=lambda r: r.arrival_time
        )
        queue = heapq.merge(prefilling, waiting, key=lambda r: r.arrival_time)
        full = self.max_num_batched_tokens
        return feasibility.overdue(queue, now, self.max_wait_s, self.full_step_s(running), full)

    def full_step_s(self, running: list[Request]) -> float:
        """A step carrying the whole token budget of prefill beside the running decodes."""
        full = self.max_num_batched_tokens
        context = sum(r.num_tokens for r in running)
        return self.context.cost_model.predict_step(full, len(running), context + full)

    def make_room(
        self,
        overdue: list[Request],
        running: list[Request],
        now: float,
        preempt: Callable[[Request, float], None],
    ) -> bool:
        """Preempt (through `preempt`, which takes the victim out of `running`), for each
        overdue request that can wait no longer, the running request whose preemption costs
        least against its own SLO, when the batch has no place or the pool no blocks for its
        first chunk. Only requests past their first token and not protected are taken. Whether
        any was preempted."""
        if not overdue:
            return False
        preempted = False
        places = self.max_num_seqs - len(running)
        cost = self.context.cost_model
        full = self.max_num_batched_tokens
        full_step_s = self.full_step_s(running)
        # The overdue go oldest first and share the budget: each waits for those ahead of it.
        tokens_ahead = 0
        for request in overdue:
            ahead, tokens_ahead = tokens_ahead, tokens_ahead + request.num_uncomputed_tokens
            if request.status is RequestStatus.RUNNING or not feasibility.critical(
                request, now, self.max_wait_s, full_step_s, full, ahead
            ):
                continue
            chunk = min(request.num_tokens, full)
            needed = self.kv_cache.blocks_needed(chunk)
            while places <= 0 or needed > self.kv_cache.pool.num_free_blocks:
                victims = [
                    r
                    for r in running
                    if r.first_token_time is not None and r.num_preemptions < self.max_preemptions
                ]
                if not victims:
                    break
                victim = max(victims, key=lambda r: feasibility.victim_rank(r, cost, now))
                preempt(victim, now)
                preempted = True
                places += 1
            places -= 1
        return preempted
