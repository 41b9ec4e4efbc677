"""How many draft tokens each running decode verifies this step, from the step-cost fit and
each request's acceptance rate: a draft is added only while it lowers the number of requests
predicted to miss their TPOT target, or, at the same number, raises the tokens the step yields
per second. So speculation is on at a memory-bound step (a verified row costs little beside
the weights' read) and off at a compute-bound one (every row costs its share)."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from baton.core.scheduling.step_cost import StepCost


def expected_tokens(rate: float, num_drafts: int) -> float:
    """Tokens a step yields a request verifying `num_drafts` drafts, each accepted with
    `rate` until the first rejection: the accepted prefix and the token sampled after it."""
    if rate >= 1.0:
        return num_drafts + 1.0
    return (1.0 - rate ** (num_drafts + 1)) / (1.0 - rate)


def plan_drafts(
    rates: Sequence[float],
    tpot_targets_s: Sequence[float | None],
    max_drafts: Sequence[int],
    cost: StepCost,
    *,
    num_prefill_tokens: int,
    num_context_tokens: int,
    token_budget: int,
    draft_token_s: float | None = None,
) -> list[int]:
    """Draft tokens per decode (aligned with `rates`, each request's acceptance rate): at most
    its `max_drafts`, all of them within `token_budget`. Drafts are added greedily, the one most
    likely accepted first (a request's j-th draft yields `rate ** j` tokens), and the first that
    does not improve the step's (misses, -tokens per second) stops the search: later ones are
    less likely accepted and cost the same. A draft costs `draft_token_s`, by default what the
    fit charges a prompt token."""
    num_decodes = len(rates)
    drafts = [0] * num_decodes
    heap = [(-rate, i) for i, rate in enumerate(rates) if max_drafts[i] > 0 and rate > 0.0]
    if not heap or token_budget <= 0:
        return drafts
    heapq.heapify(heap)
    # A fit with nothing learnt yet may predict a free step; a nanosecond keeps the rates finite.
    base_s = max(cost.predict_step(num_prefill_tokens, num_decodes, num_context_tokens), 1e-9)
    draft_s = cost.prefill_token_s() if draft_token_s is None else draft_token_s
    yields = [1.0] * num_decodes
    total_yield = float(num_decodes)
    # A request misses when the step outlasts its target times its yield: kept sorted, the
    # misses at a step length are one bisection.
    bounds = sorted(target for target in tpot_targets_s if target is not None)
    step_s = base_s
    best = (bisect.bisect_left(bounds, step_s), -total_yield / step_s)
    num_drafted = 0
    while heap and num_drafted < token_budget:
        _, i = heapq.heappop(heap)
        new_yield = expected_tokens(rates[i], drafts[i] + 1)
        target = tpot_targets_s[i]
        if target is not None:
            old_bound, new_bound = target * yields[i], target * new_yield
            bounds.pop(bisect.bisect_left(bounds, old_bound))
            bisect.insort(bounds, new_bound)
        candidate_s = step_s + draft_s
        candidate_yield = total_yield - yields[i] + new_yield
        score = (bisect.bisect_left(bounds, candidate_s), -candidate_yield / candidate_s)
        if score >= best:
            break  # `bounds` now holds the rejected draft's bound, but the search is over
        best, step_s, total_yield = score, candidate_s, candidate_yield
        yields[i] = new_yield
        drafts[i] += 1
        num_drafted += 1
        if drafts[i] < max_drafts[i]:
            heapq.heappush(heap, (-(rates[i] ** (drafts[i] + 1)), i))
    return drafts
