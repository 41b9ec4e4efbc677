"""Prefill and decode apart, chosen per request: with `--prefill-replicas P` the first P
replicas prefill and the others decode. A request either runs whole on one replica (local) or
is prefilled on a prefill replica and decoded on a decode replica (split), its KV moved between
them (core/replicas/kv_transfer.py). `--disaggregate never` routes every request locally over
all replicas (the co-located layout), `always` splits every request, and `auto` (the default)
weighs the ways for each request on the same forecast as admission
(core/scheduling/ttft_forecast.py) with the `slo` planner's TPOT cap: a prompt short enough to
be prefilled in one step beside a decode replica's decodes stays there; a longer one goes the
way its first token comes soonest, through a prefill replica (transfer counted) or whole on a
replica whose requests share its TPOT target (the co-located layout, one option among them); a
request the decode replicas cannot decode at its pace runs whole on a prefill replica, and a
prefill replica keeps decoding what it prefilled when no decode replica has room, so roles are
preferences in both directions. A moved decode lands on no replica owing prompts.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from baton.core.kv_cache.kv_cache_manager import blocks_needed
from baton.core.replicas.kv_room import room_blocks
from baton.core.replicas.kv_transfer import TransferCost
from baton.core.replicas.replica_ledger import ReplicaLedger
from baton.core.replicas.router import Candidate, NoReplicaError, Router, RouteRequest
from baton.core.request import SLO
from baton.core.scheduling.ttft_forecast import Forecast

DISAGGREGATE_MODES = ("auto", "always", "never")


class Role(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    # Without prefill replicas every replica prefills and decodes its own requests.
    BOTH = "both"


def replica_roles(num_replicas: int, num_prefill: int) -> list[Role]:
    if not 0 <= num_prefill < num_replicas:
        raise ValueError(
            f"--prefill-replicas must be >= 0 and leave a decode replica of --replicas "
            f"{num_replicas}, got {num_prefill}"
        )
    if num_prefill == 0:
        return [Role.BOTH] * num_replicas
    return [Role.PREFILL] * num_prefill + [Role.DECODE] * (num_replicas - num_prefill)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request goes: `replica_id` prefills it (None: admission refuses it, `forecast`
    the best option's); with `split`, its decoding moves to a decode replica at its first
    token (`DisaggregatingRouter.hand_off` chooses which)."""

    replica_id: int | None
    split: bool
    forecast: Forecast


@dataclass(frozen=True, slots=True)
class _Option:
    candidate: Candidate
    split: bool
    tpot_s: float
    one_chunk: bool


class DisaggregatingRouter:
    """`router`'s replicas in roles (`replica_roles`), placing each request by `mode`; the
    transfer of `kv_bytes_per_token` a prompt token over `transfer` is counted in the TPOT of
    a split request. Not thread-safe, as `Router`."""

    def __init__(
        self,
        router: Router,
        num_prefill: int,
        mode: str,
        transfer: TransferCost,
        kv_bytes_per_token: int,
    ) -> None:
        if mode not in DISAGGREGATE_MODES:
            raise ValueError(
                f"--disaggregate must be one of {', '.join(DISAGGREGATE_MODES)}, got {mode!r}"
            )
        self.router = router
        self.roles = replica_roles(len(router.replicas), num_prefill)
        self.mode = "never" if num_prefill == 0 else mode
        self.transfer = transfer
        self.kv_bytes_per_token = kv_bytes_per_token
        self.num_split = 0

    def transfer_s(self, num_tokens: int) -> float:
        return self.transfer.seconds(num_tokens * self.kv_bytes_per_token)

    def route(self, request: RouteRequest, now: float) -> Placement:
        """Place `request` and record it in its prefilling replica's ledger."""
        if self.mode == "never":
            route = self.router.route(request, now)
            return Placement(route.replica_id, False, route.forecast)
        options = self._options(request, now)
        if not options:
            raise NoReplicaError("no engine replica is serving; they are restarting")
        chosen = self._choose(request, options)
        if chosen is None:
            best = min(options, key=lambda o: o.candidate.forecast.ttft_s)
            return Placement(None, best.split, best.candidate.forecast)
        replica = chosen.candidate.replica
        self.router.turn += 1
        replica.add(
            request.request_id, request.num_prompt_tokens, request.slo, request.block_hashes, now
        )
        self.num_split += chosen.split
        return Placement(replica.replica_id, chosen.split, chosen.candidate.forecast)

    def hand_off(
        self,
        request_id: str,
        num_prompt_tokens: int,
        slo: SLO,
        block_hashes: Sequence[bytes],
        source: int,
        now: float,
    ) -> int:
        """The replica to decode a request handed off at its first token by replica `source`:
        of the decode replicas (under `auto` also `source` itself, which needs no transfer),
        first those whose decode step with it keeps its TPOT target (transfer counted), that
        have a place free and, for a replica it would move to, the KV room for it, decode
        replicas before `source`, then the shortest step, then the fewest tokens held;
        recorded in its ledger as decoding."""
        replicas = self._healthy(Role.DECODE)
        prefiller = self.router.replicas[source]
        if self.mode == "auto" and prefiller.healthy:
            replicas.append(prefiller)
        if not replicas:
            raise NoReplicaError("no decode replica is serving; they are restarting")
        target_s = math.inf if slo.tpot_ms is None else slo.tpot_ms / 1000
        intervals = max(1.0, _mean_intervals(replicas))
        moved_s = self.transfer_s(num_prompt_tokens) / intervals

        def lacks_room(replica: ReplicaLedger) -> bool:
            # A full replica would preempt a decode to take it, and recompute that decode's
            # KV. What counts is the growth until its next decode is expected to end and give
            # blocks back: one request's mean life spread over the decodes sharing it.
            horizon = math.ceil(intervals / max(1, replica.num_in_flight))
            needed = blocks_needed(num_prompt_tokens + 1, replica.block_size)
            return room_blocks(replica, horizon) < needed

        def rank(replica: ReplicaLedger) -> tuple:
            if replica is prefiller:
                step_s, delay_s = _decode_step_s(replica, num_prompt_tokens), 0.0
            else:
                step_s, delay_s = _landing_step_s(replica, num_prompt_tokens), moved_s
            return (
                step_s + delay_s > target_s
                or replica.num_in_flight >= replica.max_num_seqs
                or (replica is not prefiller and lacks_room(replica)),
                replica is prefiller,
                step_s,
                replica.num_tokens,
            )

        chosen = min(replicas, key=rank)
        chosen.add(request_id, num_prompt_tokens, slo, block_hashes, now)
        chosen.forecast.first_token(request_id, now)
        return chosen.replica_id

    def _healthy(self, role: Role) -> list[ReplicaLedger]:
        return [
            replica
            for replica, replica_role in zip(self.router.replicas, self.roles, strict=True)
            if replica_role is role and replica.healthy
        ]

    def _options(self, request: RouteRequest, now: float) -> list[_Option]:
        """Every way to serve `request`: locally on each replica (`auto`) and split through
        each prefill replica (decoding where `hand_off` would send it now)."""
        decoders = self._healthy(Role.DECODE)
        prefillers = self._healthy(Role.PREFILL)
        options = []
        if decoders:
            best_decode_s = min(_landing_step_s(r, request.num_prompt_tokens) for r in decoders)
            split_tpot_s = best_decode_s + self.transfer_s(request.num_prompt_tokens) / max(
                1.0, _mean_intervals(decoders)
            )
            options += [
                _Option(self._candidate(r, request, now), True, split_tpot_s, False)
                for r in prefillers
            ]
        if self.mode == "auto":
            for replica in decoders + prefillers:
                candidate = self._candidate(replica, request, now)
                uncached = request.num_prompt_tokens - candidate.cached_blocks * replica.block_size
                one_chunk = uncached <= replica.forecast.capped_prefill_budget()
                tpot_s = _decode_step_s(replica, request.num_prompt_tokens)
                options.append(_Option(candidate, False, tpot_s, one_chunk))
        return options

    def _candidate(self, replica: ReplicaLedger, request: RouteRequest, now: float) -> Candidate:
        cached = replica.cached_blocks(request.block_hashes)
        budget = replica.forecast.capped_prefill_budget()
        forecast = replica.predict(
            request.num_prompt_tokens, cached, request.slo.ttft_ms, now, budget
        )
        return Candidate(replica, cached, forecast)

    def _choose(self, request: RouteRequest, options: list[_Option]) -> _Option | None:
        """Of the options meeting both targets: a prompt that fits one capped step on a decode
        replica (the router's policy deciding among them); else the earliest first token among
        the splits and the whole request on any replica whose requests in flight all share its
        TPOT target, so a replica of such requests runs as a co-located one; else the whole
        request on a prefill replica. With none meeting, the kinds in that order among the
        options admission accepts (the TTFT forecast's rule, and a TPOT some replica is
        predicted to keep), or None when it accepts none. A longer prompt runs whole only
        beside its own target: beside tighter decodes its context would lengthen steps paced
        for them, beside looser ones steps at their pace would cost it its own."""
        slo = request.slo
        ttft_s = math.inf if slo.ttft_ms is None else slo.ttft_ms / 1000
        tpot_s = math.inf if slo.tpot_ms is None else slo.tpot_ms / 1000
        kinds = (
            lambda o: not o.split and o.one_chunk and self._role(o) is Role.DECODE,
            lambda o: o.split,
            lambda o: not o.split and self._role(o) is Role.PREFILL,
        )
        meeting = [
            o for o in options if o.candidate.forecast.ttft_s <= ttft_s and o.tpot_s <= tpot_s
        ]
        factor = self.router.admission_factor
        admitted = options
        if slo.ttft_ms is not None:
            admitted = [
                o for o in admitted if not o.candidate.forecast.refuses(slo.ttft_ms, factor)
            ]
        if factor > 0:
            # Admitted, a request no replica can decode at its pace would miss its TPOT target
            # and lengthen the steps of the batch it joins.
            admitted = [o for o in admitted if o.tpot_s <= tpot_s]
        chosen = self._pick([o for o in meeting if kinds[0](o)])
        if chosen is not None:
            return chosen
        alike = [o for o in meeting if o.split or self._among_alike(o, tpot_s)]
        if alike:
            return min(alike, key=lambda o: o.candidate.forecast.ttft_s)
        for candidates in (meeting, admitted):
            for kind in kinds:
                chosen = self._pick([o for o in candidates if kind(o)])
                if chosen is not None:
                    return chosen
        return None

    def _among_alike(self, option: _Option, tpot_s: float) -> bool:
        """Whether every request in flight on `option`'s replica has the TPOT target `tpot_s`."""
        return option.candidate.replica.forecast.tpot_targets() <= {tpot_s}

    def _role(self, option: _Option) -> Role:
        return self.roles[option.candidate.replica.replica_id]

    def _pick(self, options: list[_Option]) -> _Option | None:
        if not options:
            return None
        chosen = self.router.policy([o.candidate for o in options], self.router.turn)
        return next(o for o in options if o.candidate is chosen)


def _decode_step_s(replica: ReplicaLedger, num_prompt_tokens: int) -> float:
    """A step on `replica` once its requests in flight, and one more of `num_prompt_tokens`,
    all decode (as many as the batch holds): what the new request's TPOT comes to there. The
    planner's cap keeps prefill within the decodes' targets on every replica, a prefill
    replica's too: counting its owed prompts at the full budget would call its spare decode
    capacity full and leave a decode-bound load to the decode replicas alone."""
    num_seqs = min(replica.num_in_flight + 1, replica.max_num_seqs)
    return replica.stats.step_cost.predict_step(0, num_seqs, replica.num_tokens + num_prompt_tokens)


def _landing_step_s(replica: ReplicaLedger, num_prompt_tokens: int) -> float:
    """A step on `replica` for a decode moved there: `_decode_step_s` with the prompts the
    replica owes beside it at the planner's cap, which fills a step up to the tightest target
    there and leaves no room for a decode already late by its transfer."""
    owed = min(replica.forecast.owed_tokens, replica.forecast.capped_prefill_budget())
    num_seqs = min(replica.num_in_flight + 1, replica.max_num_seqs)
    return replica.stats.step_cost.predict_step(
        owed, num_seqs, replica.num_tokens + num_prompt_tokens
    )


def _mean_intervals(replicas: Sequence[ReplicaLedger]) -> float:
    """The inter-token intervals a request lives through on these replicas, on average: its
    measured lifetime after the first token over a decode step; a transfer's delay is spread
    over them in its TPOT. A replica whose fit prices a decode step at nothing (one fitted to
    prefill chunks alone can clamp every other term to zero) says nothing of its intervals."""
    counts = []
    for replica in replicas:
        step_s = replica.stats.step_cost.predict_step(
            0, max(1, replica.num_in_flight), replica.num_tokens
        )
        if replica.forecast.lifetime_s and step_s > 0:
            counts.append(replica.forecast.lifetime_s / step_s)
    return sum(counts) / len(counts) if counts else 1.0
