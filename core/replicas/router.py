"""Routing requests over engine replicas: `round-robin`, `least-loaded` (fewest waiting and
running tokens), `prefix` (the replica whose prefix cache likely holds the prompt's first
blocks) and `slo` (the replica with the lowest predicted TTFT, from the same feasibility math
as admission's forecast, tie-broken by prefix affinity). Each policy is a function of the
replicas' read-only views (core/replicas/replica_ledger.py); `Router` is the mechanism around them:
the round-robin turn, admission, and recording the routed request in its replica's ledger.

Admission: under `slo` a request is refused only when every healthy replica's forecast refuses
it; under the others, when the chosen replica's does, as that replica alone would do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from baton.core.replicas.replica_ledger import ReplicaLedger, prompt_block_hashes
from baton.core.request import SLO
from baton.core.scheduling.ttft_forecast import Forecast

ROUTERS = ("slo", "least-loaded", "prefix", "round-robin")
DEFAULT_ROUTER = "slo"


class NoReplicaError(RuntimeError):
    """Every replica is down: nothing can serve the request now."""


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What routing needs of a request: built once at admission from its prompt."""

    request_id: str
    num_prompt_tokens: int
    slo: SLO
    block_hashes: tuple[bytes, ...]

    @classmethod
    def of(
        cls, request_id: str, prompt_token_ids: Sequence[int], slo: SLO, block_size: int
    ) -> RouteRequest:
        return cls(
            request_id,
            len(prompt_token_ids),
            slo,
            prompt_block_hashes(prompt_token_ids, block_size),
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """One healthy replica as a policy weighs it for one request."""

    replica: ReplicaLedger
    cached_blocks: int
    forecast: Forecast


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes: `replica_id`, or None when admission refuses it; `forecast` is the
    chosen replica's (or, refused, the best one's), for the 429's Retry-After."""

    replica_id: int | None
    forecast: Forecast
    cached_blocks: int = 0


# A policy: the healthy candidates (in replica order, never empty) and the round-robin turn,
# to the chosen one.
Policy = Callable[[Sequence[Candidate], int], Candidate]


def round_robin(candidates: Sequence[Candidate], turn: int) -> Candidate:
    return candidates[turn % len(candidates)]


def least_loaded(candidates: Sequence[Candidate], turn: int) -> Candidate:
    """Fewest tokens waiting and running; ties go round the replicas from the turn."""
    count = len(candidates)
    return min(
        enumerate(candidates),
        key=lambda item: (item[1].replica.num_tokens, (item[0] - turn) % count),
    )[1]


def prefix_affinity(candidates: Sequence[Candidate], turn: int) -> Candidate:
    """The most of the prompt's leading blocks cached; with none anywhere, least loaded."""
    most = max(candidate.cached_blocks for candidate in candidates)
    return least_loaded([c for c in candidates if c.cached_blocks == most], turn)


def lowest_ttft(candidates: Sequence[Candidate], turn: int) -> Candidate:
    """The lowest predicted TTFT. Predictions within one step's fixed cost of the best are a
    tie (finer than the forecast can tell apart): of those, the most prefix blocks cached,
    then the fewest tokens held, then the lowest prediction.

    Fewest tokens before the lower prediction: the forecast sees a request's wait for its
    first token, not the decodes it joins, so choosing by a difference below its resolution
    piles decodes on one replica, whose longer steps then miss TPOT targets."""
    best = min(candidate.forecast.ttft_s for candidate in candidates)
    tolerance = min(c.replica.stats.step_cost.base_s for c in candidates)
    tied = [c for c in candidates if c.forecast.ttft_s <= best + tolerance]
    most = max(candidate.cached_blocks for candidate in tied)
    count = len(candidates)
    order = {id(c): index for index, c in enumerate(candidates)}
    return min(
        (c for c in tied if c.cached_blocks == most),
        key=lambda c: (c.replica.num_tokens, c.forecast.ttft_s, (order[id(c)] - turn) % count),
    )


POLICIES: dict[str, Policy] = {
    "slo": lowest_ttft,
    "least-loaded": least_loaded,
    "prefix": prefix_affinity,
    "round-robin": round_robin,
}


class Router:
    """Routes requests over `replicas` (their ledgers, indexed by replica id) with the policy
    named `name`; `admission_factor` is SLO admission's (0: never refuse)."""

    def __init__(
        self, name: str, replicas: Sequence[ReplicaLedger], admission_factor: float
    ) -> None:
        if name not in POLICIES:
            raise ValueError(f"--router must be one of {', '.join(ROUTERS)}, got {name!r}")
        self.name = name
        self.policy = POLICIES[name]
        self.replicas = list(replicas)
        self.admission_factor = admission_factor
        self.turn = 0

    def choose(self, request: RouteRequest, now: float, *, admit: bool = True) -> Route:
        """Where `request` would go, changing nothing; raises `NoReplicaError` when none is up.
        `admit=False` never refuses (a request admission has judged already)."""
        target = request.slo.ttft_ms
        judged = admit and target is not None
        candidates = []
        for replica in self.replicas:
            if not replica.healthy:
                continue
            cached = replica.cached_blocks(request.block_hashes)
            forecast = replica.predict(request.num_prompt_tokens, cached, target, now)
            candidates.append(Candidate(replica, cached, forecast))
        if not candidates:
            raise NoReplicaError("no engine replica is serving; they are restarting")
        if self.name == "slo" and judged:
            # Refused only when no replica can make the target: the policy picks among those
            # that can, if any.
            feasible = [c for c in candidates if not self._refuses(c, target)]
            if not feasible:
                best = min(candidates, key=lambda c: c.forecast.ttft_s)
                return Route(None, best.forecast, best.cached_blocks)
            chosen = self.policy(feasible, self.turn)
        else:
            chosen = self.policy(candidates, self.turn)
            if judged and self._refuses(chosen, target):
                return Route(None, chosen.forecast, chosen.cached_blocks)
        return Route(chosen.replica.replica_id, chosen.forecast, chosen.cached_blocks)

    def route(self, request: RouteRequest, now: float, *, admit: bool = True) -> Route:
        """Choose a replica for `request` and record it there as in flight; a refused request
        is recorded nowhere."""
        route = self.choose(request, now, admit=admit)
        if route.replica_id is not None:
            self.turn += 1
            self.replicas[route.replica_id].add(
                request.request_id,
                request.num_prompt_tokens,
                request.slo,
                request.block_hashes,
                now,
            )
        return route

    def _refuses(self, candidate: Candidate, target_ms: float) -> bool:
        return candidate.forecast.refuses(target_ms, self.admission_factor)
