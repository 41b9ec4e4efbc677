"""Speculative decoding's side of a step: which running decodes carry draft tokens and which,
and what their verification taught about each request's acceptance rate."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence

from baton.core.request import Request
from baton.core.scheduling.speculation import plan_drafts
from baton.core.scheduling.step_cost import StepCost
from baton.core.speculative.acceptance import SpecDecodeCounters
from baton.core.speculative.proposer import Proposer
from baton.core.step_stats import StepStats

# Drafted steps whose median sets a draft token's measured cost: a step the OS preempted is one
# long sample among them, where a running mean would carry it for many steps.
DRAFT_COST_WINDOW = 32
# Steps after which a sample is forgotten, drafted or not: a price that stops all drafting gets
# no drafted step to replace it, so one stalled first sample would otherwise end speculation.
DRAFT_COST_MEMORY_STEPS = 2 * DRAFT_COST_WINDOW


class Speculator:
    """Proposes drafts (by prompt lookup, or a draft model's placeholders) for the decodes the
    planner gives draft tokens."""

    def __init__(self, proposer: Proposer, max_drafts: int, cost: StepCost) -> None:
        self.proposer = proposer
        self.max_drafts = max_drafts
        self.cost = cost
        self.counters = SpecDecodeCounters()
        # What each recent drafted step's drafts added to it, per draft token: the fit prices
        # a verified row as a prompt token, but a few rows cost more each than a long prompt's
        # (and a sampled row's sampling) do, which a linear fit over all steps cannot tell
        # apart. A draft model's forwards that propose the tokens are measured in it too.
        # Each as (the step it was measured at, seconds per draft token).
        self._draft_costs: deque[tuple[int, float]] = deque(maxlen=DRAFT_COST_WINDOW)
        self._num_steps = 0

    @property
    def draft_token_s(self) -> float:
        """Seconds a draft token adds to a step, measured: the median over recent drafted steps
        (0 before any, or once the last is DRAFT_COST_MEMORY_STEPS steps old)."""
        return (
            statistics.median(cost for _, cost in self._draft_costs) if self._draft_costs else 0.0
        )

    def drafts_beside(
        self, decodes: Sequence[Request], prefilling: Iterable[Request], token_budget: int
    ) -> list[list[int]]:
        """Draft tokens for each of `decodes` (aligned; [] for none), in the step's
        `token_budget` that the prefill `prefilling` requests are owed would leave: speculation
        never delays a first token."""
        spare = token_budget - len(decodes)
        owed = 0
        for request in prefilling:
            owed += request.num_uncomputed_tokens
            if owed >= spare:
                return [[] for _ in decodes]
        return self.drafts(decodes, spare - owed, owed)

    def drafts(
        self, decodes: Sequence[Request], token_budget: int, num_prefill_tokens: int
    ) -> list[list[int]]:
        """Draft tokens for each of `decodes` (aligned; [] for none) within `token_budget`
        beside them, in a step also carrying about `num_prefill_tokens` of prefill."""
        priors = {greedy: self.counters.prior_rate(greedy) for greedy in (True, False)}
        plan = plan_drafts(
            [request.drafts.rate(priors[request.sampling_params.greedy]) for request in decodes],
            [_tpot_target_s(request) for request in decodes],
            [self._room(request) for request in decodes],
            self.cost,
            num_prefill_tokens=num_prefill_tokens,
            num_context_tokens=sum(request.num_tokens for request in decodes),
            token_budget=token_budget,
            draft_token_s=max(self.cost.prefill_token_s(), self.draft_token_s),
        )
        proposals = []
        for request, num_drafts in zip(decodes, plan, strict=True):
            proposal = self.proposer.propose(request.token_ids, num_drafts) if num_drafts else []
            if not proposal:
                request.drafts.fade()
            proposals.append(proposal)
        return proposals

    def observe_step(self, stats: StepStats) -> None:
        """A step listener: what the step's drafts added to it beyond the fit's prediction of
        the same step without them. Every step ages the samples, drafted or not."""
        self._num_steps += 1
        costs = self._draft_costs
        while costs and costs[0][0] <= self._num_steps - DRAFT_COST_MEMORY_STEPS:
            costs.popleft()
        if not stats.num_draft_tokens:
            return
        without = self.cost.predict_step(
            stats.num_prefill_tokens, stats.num_decode_tokens, stats.num_context_tokens
        )
        costs.append(
            (self._num_steps, max(0.0, stats.duration_s - without) / stats.num_draft_tokens)
        )

    def observe(self, request: Request, num_drafted: int, num_accepted: int) -> None:
        request.drafts.record(num_drafted, num_accepted)
        self.counters.record(num_drafted, num_accepted, request.sampling_params.greedy)

    def _room(self, request: Request) -> int:
        """Drafts the request may verify: none past its last output token (the token sampled
        after the drafts counts too), none while it pools, and none under a grammar that starts
        after a reasoning model's thinking (where it starts must come from committed tokens)."""
        params = request.sampling_params
        constraint = params.structured_output
        if params.pooling is not None or (
            constraint is not None and constraint.after_token_id is not None
        ):
            return 0
        left = (params.max_tokens or 0) - request.num_output_tokens - 1
        return max(0, min(self.max_drafts, left))


def _tpot_target_s(request: Request) -> float | None:
    tpot_ms = request.slo.tpot_ms
    return None if tpot_ms is None else tpot_ms / 1000
