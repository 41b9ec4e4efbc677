"""The engine's state as the front end may see it: one immutable snapshot the step loop
publishes after every iteration, so nothing outside the step thread reads its live queues."""

from __future__ import annotations

from dataclasses import dataclass, field

from baton.core.replicas.kv_transfer import TransferTotals
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.speculative.acceptance import SpecDecodeStats


@dataclass(slots=True, frozen=True)
class EngineStats:
    """Counts are totals since start; `waiting_by_priority` is (priority, count), sorted."""

    num_running: int = 0
    num_waiting: int = 0
    waiting_by_priority: tuple[tuple[int, int], ...] = ()
    kv_cache_usage: float = 0.0
    num_steps: int = 0
    num_preemptions: int = 0
    # Steps in which the KV growth forecast held a waiting prompt back.
    num_kv_growth_holds: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # KV blocks freed because they slid out of every layer's attention window.
    kv_blocks_freed_by_window: int = 0
    # The online step-cost fit: coefficients, its mean |error| / measured, steps observed.
    step_cost: CostCoefficients = field(default_factory=CostCoefficients)
    step_cost_error: float | None = None
    step_cost_observations: int = 0
    # Mean seconds from a request's first token to its finish (core/scheduling/lifetime.py).
    mean_lifetime_s: float = 0.0
    # Compiled output constraints kept for reuse, and the memory they hold.
    grammar_cache_entries: int = 0
    grammar_cache_bytes: int = 0
    # Speculative decoding's totals; None when the engine does not speculate.
    spec_decode: SpecDecodeStats | None = None


@dataclass(slots=True, frozen=True)
class ReplicaStatus:
    """One engine replica as `/v1/stats` and `/metrics` show it: where it runs, whether it
    serves, its last snapshot, the front end's counts of the requests it sent there, its role."""

    replica_id: int
    node: str
    pid: int
    healthy: bool
    stats: EngineStats
    requests_in_flight: int = 0
    requests_routed: int = 0
    requests_finished: int = 0
    # prefill, decode or both (core/replicas/disaggregation.py's Role), and the KV transfers it
    # sent or received.
    role: str = "both"
    kv_transfers: TransferTotals = field(default_factory=TransferTotals)
