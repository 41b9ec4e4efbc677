"""The `slo` policy: deadline-driven ordering with a feasibility test and a starvation bound,
and prefill chunks sized so running decodes keep their time-per-output-token target.

Ordering. Every request still owed prefill has a TTFT deadline (arrival + its target). Those
resuming after a preemption, and those about to break the starvation bound (`--max-wait-ms`:
no request waits longer than that for its first token, as long as the older work and its own
prefill fit in it), go first, oldest first. The rest are taken earliest deadline first, and
each one's time to first token is predicted from the prefill queued ahead of it plus its own
(the step-cost model) and, when the batch is full (`--max-num-seqs`), from when a place frees
for it: a full batch frees one every mean request lifetime / batch size (predicted lengths,
measured step time). When one would miss its deadline, the waiting request with the most
prefill among those kept so far is set aside (Moore-Hodgson's rule: it keeps the most deadlines
met, and serving a hopeless request would only make others miss too). Slack = deadline − now −
predicted time to first token. Late requests still go ahead of the on-time ones as far as half
the least slack among those allows (slack stealing, from real-time scheduling), so a missed
deadline is not also a long wait; the rest of them follow the requests with no TTFT target.

Places. A request holds its place in the batch from admission to its last token, so a full
batch makes an urgent arrival wait for one to free, however it is ordered. Patient requests
(those with a second of slack or more, no TTFT target, or a long one already missed) do not take
the last free places: enough are kept for the requests with short targets expected to arrive
before the next place frees (their measured rate × the place gap, at the Poisson 99th
percentile): trunk reservation, as telephone exchanges keep guard channels for handed-over
calls.

Prefill budget. A step's duration grows with the prefill it carries, and every running decode
waits for the whole step. A TPOT target is a per-token average (what goodput measures: time from
the first token to the last over the tokens between), so one long step is harmless to a decode
that can make it up. Each decode with a target has an allowance, the longest step it can absorb:
  banked: first token time + target × tokens so far − now, the latest its next token may land
    with its average so far within target (Andes' token deadlines), plus
  credit: what the tokens it has still to generate can repay, each saving target − the
    decode-only step time; only a share of the predicted remaining tokens counts, since the
    request may stop sooner and the batch may grow.
The budget is the largest prefill whose predicted step time fits the smallest allowance
(Sarathi-Serve's stall-free batching, with the chunk sized from the decodes' slack instead of
fixed). When the model and the lengths are exact, an allowance never drops below the decode-only
step time (a step no longer than the allowance leaves at least allowance − step + decode step),
and at the last token it is the banked part alone, so every request ends within its TPOT target.
An overdue request lifts the cap for a step, so TPOT never starves admission past the bound.

Victims: lowest priority first (the highest `priority` value), then the most slack, then the
latest arrival.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from core.arrival_rate import ArrivalRate, poisson_quantile
from core.policy import PolicyContext, SchedulingPolicy
from core.request import Request, RequestStatus
from core.step_cost import prefill_seconds

# A request is promoted ahead of every deadline when what is left of the starvation bound only
# just covers the prefill ahead of it and its own at full budget, plus this many steps; never
# before this share of the bound has passed (a prompt too long for the bound must not jump
# every queue from the start).
AGING_MARGIN_STEPS = 2
AGING_EARLIEST_SHARE = 0.5
# When even a decode-only step misses the tightest TPOT target, prefill keeps this much per
# step: the target cannot be met either way, and the queue must not freeze.
MIN_PREFILL_TOKENS = 16
# Late requests may take this share of the least slack among on-time ones; the rest is kept for
# urgent requests still to come.
STEAL_SHARE = 0.5
# Share of a decode's predicted remaining tokens whose TPOT savings it may borrow against.
FUTURE_CREDIT_SHARE = 0.5
# The TPOT cap shrinks by the step-cost model's mean relative error, up to this much.
MAX_ERROR_HEADROOM = 0.25

# Weight of the newest step in the running mean of the measured step time.
STEP_TIME_EMA_WEIGHT = 0.05
# A request with this much slack can wait for a place: in a full batch it leaves the last free
# places to urgent ones (those whose TTFT target is shorter than this).
PATIENCE_S = 1.0
# The places kept free cover the urgent requests arriving before the next place frees with
# this probability (Poisson arrivals).
GUARD_PROBABILITY = 0.99

# Where requests without a deadline and those that will miss theirs sort, after the rest.
_NO_DEADLINE, _LATE = 0, 1


class SLOPolicy(SchedulingPolicy):
    name = "slo"

    def __init__(self, context: PolicyContext | None = None) -> None:
        super().__init__(context)
        full = self.context.max_num_batched_tokens
        # The pace prefill moves at, from the last budget: tokens per step, the step's fixed
        # part (its decodes) and the marginal cost of a prefill token.
        self._pace_tokens = full
        self._decode_s = self.context.cost_model.predict_step(0, 0, 0)
        self._per_token_s = self.context.cost_model.prefill_token_s()
        self._capped = False
        self._overdue_waiting = False
        # Places in the batch: how many are free and, when none is, seconds between two places
        # freeing; the mean step time measured on the clock turns tokens into seconds.
        self._free_places = self.context.max_num_seqs
        self._running: tuple[Request, ...] = ()
        self._place_gap: float | None = 0.0
        self._step_s = self._decode_s
        self._last_step: float | None = None
        self.arrivals = ArrivalRate()

    def prefill_time_s(self, num_tokens: int) -> float:
        """Predicted seconds until `num_tokens` of prefill are done at the current pace."""
        return prefill_seconds(num_tokens, self._pace_tokens, self._decode_s, self._per_token_s)

    def overdue(self, waiting: Sequence[Request], now: float) -> set[str]:
        """Requests that must start now to keep the starvation bound: what is left of their
        bound only just covers, at full budget, the prefill of every older request still
        waiting for its first token plus their own (they are served oldest first)."""
        bound = self.context.max_wait_s
        full = self.context.max_num_batched_tokens
        full_step_s = self.context.cost_model.predict_step(full, 0, full)
        earliest = now - AGING_EARLIEST_SHARE * bound
        margin_s = AGING_MARGIN_STEPS * full_step_s
        overdue: set[str] = set()
        tokens = places = 0
        for request in sorted(waiting, key=_arrival):
            if request.first_token_time is not None:
                continue
            tokens += _prefill_left(request)
            places += _needs_place(request)
            if request.arrival_time > earliest:
                break
            # A full batch delays the start too: the request needs a place after the older ones.
            need_s = max(-(-tokens // full) * full_step_s, self.place_wait_s(places - 1))
            if now - request.arrival_time >= bound - need_s - margin_s:
                overdue.add(request.request_id)
        return overdue

    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        self.arrivals.observe(waiting, now)
        first, with_deadline, rest = [], [], []
        overdue = self.overdue(waiting, now)
        for request in waiting:
            if request.first_token_time is not None or request.request_id in overdue:
                first.append(request)
            elif request.slo.ttft_ms is None:
                rest.append(((_NO_DEADLINE, request.priority, *_arrival(request)), request))
            else:
                deadline = request.arrival_time + request.slo.ttft_ms / 1000
                with_deadline.append(((deadline, *_arrival(request)), request))
        self._overdue_waiting = any(r.first_token_time is None for r in first)
        first.sort(key=_arrival)
        with_deadline.sort(key=lambda item: item[0])
        ahead = (sum(_prefill_left(r) for r in first), sum(_needs_place(r) for r in first))
        on_time, late = self._split_by_deadline(with_deadline, ahead, now)
        slack = math.inf  # the least slack among the requests on time
        tokens, places = ahead
        urgent = {r.request_id for r in first}  # those no place is kept from
        for deadline, request in on_time:
            tokens += _prefill_left(request)
            places += _needs_place(request)
            own_slack = deadline - now - self.first_token_s(request, tokens, places)
            slack = min(slack, own_slack)
            if own_slack < PATIENCE_S:
                urgent.add(request.request_id)
        # Slack stealing: late requests go ahead of the on-time ones as far as a share of the
        # least slack among those allows, so a missed deadline is not also a long wait. One
        # that needs a place in a full batch also puts each on-time request a place later.
        late.sort(key=lambda r: (r.priority, *_arrival(r)))
        budget_s = STEAL_SHARE * slack
        per_token_s = self.prefill_time_s(self._pace_tokens) / self._pace_tokens
        place_s = self._place_gap_s if late and places >= self._free_places else 0.0
        stolen = []
        for request in late:
            if request.slo.ttft_ms / 1000 < PATIENCE_S:
                urgent.add(request.request_id)
            cost_s = _prefill_left(request) * per_token_s + _needs_place(request) * place_s
            if cost_s <= budget_s:
                stolen.append(request)
                budget_s -= cost_s
            else:
                rest.append(((_LATE, request.priority, *_arrival(request)), request))
        rest.sort(key=lambda item: item[0])
        ordered = first + stolen + [request for _, request in on_time]
        return self._keep_places(ordered + [request for _, request in rest], urgent)

    def _keep_places(self, ordered: list[Request], urgent: set[str]) -> list[Request]:
        """Hold back the patient requests that would take one of the last free places, keeping
        those for urgent requests arriving before the next place frees (trunk reservation, as
        guard channels keep lines free for handed-over calls)."""
        rate_s = self.arrivals.per_s_below(PATIENCE_S)
        if not ordered or rate_s == 0:
            return ordered  # nothing to hold back, or no urgent arrival to keep a place for
        guard = poisson_quantile(rate_s * self._place_gap_s, GUARD_PROBABILITY)
        if guard == 0 or self._free_places > guard + len(ordered):
            return ordered
        free = self._free_places
        kept = []
        for request in ordered:
            if _needs_place(request):
                if free <= guard and request.request_id not in urgent:
                    continue
                free -= 1
            kept.append(request)
        return kept

    def _split_by_deadline(
        self, with_deadline: list, ahead: tuple[int, int], now: float
    ) -> tuple[list[tuple[float, Request]], list[Request]]:
        """Earliest deadline first, setting aside requests until every one kept is predicted to
        make its deadline: when one would miss, the waiting request with the most prefill among
        those kept so far (it included) goes, as in Moore-Hodgson's rule, which keeps the most
        deadlines met; serving a hopeless request would only spend the time of those behind."""
        tokens, places = ahead
        kept: list[tuple[float, Request]] = []
        largest: list[tuple[int, float, int, Request]] = []  # heap of waiting ones kept
        dropped: set[str] = set()
        late = []
        for (deadline, *_), request in with_deadline:
            own = _prefill_left(request)
            tokens += own
            places += _needs_place(request)
            kept.append((deadline, request))
            if _needs_place(request):
                heapq.heappush(largest, (-own, -deadline, len(kept), request))
            while deadline - now < self.first_token_s(request, tokens, places):
                while largest and largest[0][3].request_id in dropped:
                    heapq.heappop(largest)  # set aside earlier, when it was the one missing
                bigger = bool(largest) and -largest[0][0] > own
                victim = heapq.heappop(largest)[3] if bigger else request
                dropped.add(victim.request_id)
                late.append(victim)
                tokens -= _prefill_left(victim)
                places -= _needs_place(victim)
                if victim is request:
                    break
        on_time = [(d, r) for d, r in kept if r.request_id not in dropped]
        return on_time, late

    def first_token_s(self, request: Request, tokens: int, places: int) -> float:
        """Predicted seconds until `request`'s first token, with `tokens` of prefill queued up
        to and including its own and `places` requests (it included, if it needs one) wanting
        a place in the batch: the prefill ahead at the current pace, or its own prefill after
        its place frees, whichever is later."""
        prefill_s = self.prefill_time_s(tokens)
        if not _needs_place(request):
            return prefill_s
        own_s = self.prefill_time_s(_prefill_left(request))
        return max(prefill_s, self.place_wait_s(places - 1) + own_s)

    def place_wait_s(self, index: int) -> float:
        """Predicted seconds until the `index`-th request (from 0) waiting for a place in the
        batch gets one: at once while places are free, then one per place gap."""
        gaps = index + 1 - self._free_places
        return gaps * self._place_gap_s if gaps > 0 else 0.0

    def slack_s(self, request: Request, now: float) -> float:
        """Seconds to spare before the request's next deadline; infinite without a target.

        Before the first token: TTFT deadline − now − predicted prefill of its own prompt.
        After it: how far the request is ahead of its TPOT pace.
        """
        if request.first_token_time is None:
            if request.slo.ttft_ms is None:
                return math.inf
            deadline = request.arrival_time + request.slo.ttft_ms / 1000
            return deadline - now - self.prefill_time_s(_prefill_left(request))
        if request.slo.tpot_ms is None:
            return math.inf
        due = request.first_token_time + request.slo.tpot_ms / 1000 * request.num_output_tokens
        return due - now

    def tpot_allowance_s(self, request: Request, now: float, decode_step_s: float) -> float:
        """The longest step starting at `now` that the decoding request can absorb and still end
        within its TPOT target: its banked slack (first token time + target × tokens so far −
        now; the next token is `num_output_tokens` intervals after the first) plus the credit
        of a share of its predicted remaining tokens, each repaying target − `decode_step_s`.
        One with a single prompt token left to prefill gets one target."""
        target_s = request.slo.tpot_ms / 1000
        if request.first_token_time is None:
            return target_s
        banked = request.first_token_time + target_s * request.num_output_tokens - now
        predicted = self.context.length_predictor.predict(request)
        remaining = max(0.0, predicted - request.num_output_tokens - 1)
        credit = FUTURE_CREDIT_SHARE * remaining * max(0.0, target_s - decode_step_s)
        return banked + credit

    def prefill_budget(self, running: Sequence[Request], token_budget: int, now: float) -> int:
        cost = self.context.cost_model
        num_decodes = num_context = 0
        targeted = []
        for request in running:
            if request.num_tokens - request.num_computed_tokens == 1:
                num_decodes += 1
                num_context += request.num_tokens
                if request.slo.tpot_ms is not None:
                    targeted.append(request)
        decode_s = cost.predict_step(0, num_decodes, num_context)
        per_token_s = cost.prefill_token_s()
        # Leave room for the model's usual error, so a typical step lands within target.
        error = min(MAX_ERROR_HEADROOM, cost.mean_abs_error_ratio or 0.0)
        tightest_s = math.inf  # the smallest allowance among decodes with a TPOT target
        for request in targeted:
            tightest_s = min(
                tightest_s, self.tpot_allowance_s(request, now, decode_s * (1 + error))
            )
        budget = token_budget
        self._capped = tightest_s < math.inf and not self._overdue_waiting
        if self._capped:
            room_s = tightest_s / (1 + error) - decode_s
            if room_s <= 0:
                budget = min(token_budget, MIN_PREFILL_TOKENS)
            elif per_token_s > 0:
                # Compared as floats first: a loose target over a tiny cost overflows to inf.
                budget = int(min(token_budget, room_s / per_token_s))
        self._pace_tokens = max(1, min(budget, self.context.max_num_batched_tokens))
        self._decode_s = decode_s
        self._per_token_s = per_token_s
        self._track_places(running, now)
        return budget

    def _track_places(self, running: Sequence[Request], now: float) -> None:
        """Measure the mean step time on the clock, and from it and the predicted output
        lengths the pace at which a full batch frees places."""
        if self._last_step is not None and now > self._last_step:
            self._step_s += STEP_TIME_EMA_WEIGHT * (now - self._last_step - self._step_s)
        # The gap to the next call is a step only if this one runs something.
        self._last_step = now if running else None
        self._free_places = self.context.max_num_seqs - len(running)
        # The gap is worked out when a waiting request first needs it: a step with nobody
        # waiting (the common case in a busy decode phase) predicts no lengths at all.
        self._running = tuple(running)
        self._place_gap = None

    @property
    def _place_gap_s(self) -> float:
        """Seconds between two places freeing in the batch as it stood at `prefill_budget`."""
        if self._place_gap is None:
            running = self._running
            if not running:
                self._place_gap = 0.0
            else:
                # In a batch kept full, a place frees every mean lifetime / batch size (renewal):
                # the remaining tokens of the requests running now would mislead, since one past
                # its predicted length looks about to finish while it is as likely as not to go on.
                predict = self.context.length_predictor.predict
                mean_length = sum(predict(r) for r in running) / len(running)
                self._place_gap = mean_length * self._step_s / len(running)
        return self._place_gap

    def chunk_overhead(self, request: Request, start_position: int) -> int:
        if not self._capped:
            return 0
        c = self.context.cost_model.coefficients
        per_token_s = c[1] + c[3]
        if per_token_s <= 0:
            return 0
        # The chunk's attention also reads the KV computed before it: that lengthens the step
        # as extra prefill tokens would.
        return math.ceil(c[3] * start_position / per_token_s)

    def choose_victim(self, candidates: Sequence[Request], now: float) -> Request:
        return max(
            candidates,
            key=lambda r: (r.priority, self.slack_s(r, now), r.arrival_time, r.request_id),
        )


def _prefill_left(request: Request) -> int:
    return max(0, request.num_tokens - request.num_computed_tokens)


def _needs_place(request: Request) -> int:
    """1 if the request must be admitted into the batch before its prefill can run."""
    return int(request.status is not RequestStatus.RUNNING)


def _arrival(request: Request) -> tuple[float, str]:
    return request.arrival_time, request.request_id
