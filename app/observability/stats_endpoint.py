"""`GET /v1/stats`: a JSON snapshot for the live dashboard — the engine's published state and what
happened over a sliding window (default 60 s): latency percentiles, throughput, SLO attainment
and goodput, step composition. Times in ms, fractions in 0..1, null where the window is empty.
The window's part is computed at most once a second, so a poller costs no more than a scrape."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from baton.app.state import ServerState, json_response, server_state
from baton.core.metrics.latency import percentile
from baton.core.metrics.metric_aggregates import FinishedRecord, StepRecord
from baton.core.replicas.kv_transfer import TransferTotals

if TYPE_CHECKING:
    from baton.app.observability.prometheus import ServerMetrics
    from baton.core.engine_stats import EngineStats, ReplicaStatus


# How old the window's aggregates may be: they go over every request and step in the window,
# so pollers at any rate share one computation per this many seconds.
WINDOW_REFRESH_S = 1.0


async def stats_endpoint(request: Request) -> Response:
    summary: WindowSummary = request.app.state.window_summary
    return json_response(snapshot(server_state(request), summary))


class WindowSummary:
    """The window's part of `/v1/stats` (throughput, percentiles, SLO, step composition),
    recomputed at most once per `refresh_s` and shared by every read in between; the rest of
    the snapshot is read from the engine's published stats on each request."""

    def __init__(self, server_metrics: ServerMetrics, refresh_s: float = WINDOW_REFRESH_S) -> None:
        self.server_metrics = server_metrics
        self.refresh_s = refresh_s
        self._summary: dict[str, Any] = {}
        self._computed_at = -math.inf

    def read(self) -> dict[str, Any]:
        now = time.monotonic()
        if now - self._computed_at >= self.refresh_s:
            self._summary = self._compute(now)
            self._computed_at = now
        return self._summary

    def _compute(self, now: float) -> dict[str, Any]:
        aggregates = self.server_metrics.aggregates
        requests, steps = aggregates.window()
        uptime_s = now - self.server_metrics.started_at
        # Rates divide by the time the window really covers: less than its length just after
        # start.
        window_s = max(min(aggregates.window_s, uptime_s), 1e-3)
        return {
            "window_s": window_s,
            "requests_finished": len(requests),
            "throughput": {
                "requests_per_s": len(requests) / window_s,
                "prompt_tokens_per_s": sum(r.num_prompt_tokens for r in requests) / window_s,
                "generation_tokens_per_s": sum(r.num_output_tokens for r in requests) / window_s,
            },
            "ttft_ms": _percentiles([r.ttft_ms for r in requests if r.completed]),
            "tpot_ms": _percentiles([r.tpot_ms for r in requests if r.tpot_ms is not None]),
            "slo": _slo(requests, window_s),
            "steps": _steps(steps),
        }


def snapshot(state: ServerState, summary: WindowSummary) -> dict[str, Any]:
    engine = state.engine
    replicas = engine.replica_status()
    stats = engine.stats
    server_metrics = summary.server_metrics
    window = summary.read()
    with server_metrics.aggregates.lock:
        totals = server_metrics.aggregates.totals
        total = {
            "requests": totals.requests,
            "prompt_tokens": totals.prompt_tokens,
            "generation_tokens": totals.generation_tokens,
        }
    return {
        "model": state.model_name,
        "policy": engine.config.scheduling_policy,
        "uptime_s": time.monotonic() - server_metrics.started_at,
        "running": stats.num_running,
        "waiting": stats.num_waiting,
        "kv_cache_usage": stats.kv_cache_usage,
        "kv_blocks_freed_by_window": stats.kv_blocks_freed_by_window,
        "kv_growth_holds": stats.num_kv_growth_holds,
        **window,
        "steps": {"total": stats.num_steps, **window["steps"]},
        "step_cost": step_cost(stats),
        "spec_decode": spec_decode(stats),
        "totals": total,
        "replicas": [_replica(status) for status in replicas],
        "kv_transfers": _transfers(_sum_transfers(replicas)),
    }


def _replica(status: ReplicaStatus) -> dict[str, Any]:
    stats = status.stats
    return {
        "id": status.replica_id,
        "node": status.node,
        "pid": status.pid,
        "healthy": status.healthy,
        "running": stats.num_running,
        "waiting": stats.num_waiting,
        "kv_cache_usage": stats.kv_cache_usage,
        "requests_in_flight": status.requests_in_flight,
        "requests_routed": status.requests_routed,
        "requests_finished": status.requests_finished,
        "prefix_cache_hits": stats.prefix_cache_hits,
        "prefix_cache_queries": stats.prefix_cache_queries,
        "role": status.role,
        "kv_transfers": _transfers(status.kv_transfers),
    }


def _sum_transfers(replicas: list[ReplicaStatus]) -> TransferTotals:
    """Every replica's received transfers: each transfer once."""
    received = [status.kv_transfers for status in replicas]
    return TransferTotals(
        sum(totals.count for totals in received),
        sum(totals.failed for totals in received),
        sum(totals.num_bytes for totals in received),
        sum(totals.seconds for totals in received),
        sum(totals.migrations for totals in received),
    )


def _transfers(totals: TransferTotals) -> dict[str, Any]:
    return {
        "count": totals.count,
        "failed": totals.failed,
        "bytes": totals.num_bytes,
        "mean_ms": totals.mean_ms,
        "migrations": totals.migrations,
    }


def spec_decode(stats: EngineStats) -> dict[str, Any] | None:
    """Speculative decoding's totals and acceptance; None when the engine does not speculate."""
    spec = stats.spec_decode
    if spec is None:
        return None
    return {
        "num_drafts": spec.num_drafts,
        "num_draft_tokens": spec.num_draft_tokens,
        "num_accepted_tokens": spec.num_accepted_tokens,
        "accepted_per_position": list(spec.accepted_per_position),
        "acceptance_rate": spec.acceptance_rate,
        "mean_acceptance_length": spec.mean_acceptance_length,
    }


def step_cost(stats: EngineStats) -> dict[str, float | int | None]:
    """The engine's online step-cost fit, in readable units: what `baton simulate
    --calibrate-from` takes as its cost model (so a simulation sees the steps as they run
    inside this server, not as they run alone)."""
    cost = stats.step_cost
    return {
        "base_ms": cost.base_s * 1e3,
        "prefill_us_per_token": cost.per_prefill_token_s * 1e6,
        "decode_us_per_token": cost.per_decode_token_s * 1e6,
        "context_ns_per_token": cost.per_context_token_s * 1e9,
        "grammar_us_per_row": cost.per_constrained_row_s * 1e6,
        "mean_abs_error_ratio": stats.step_cost_error,
        "observations": stats.step_cost_observations,
    }


def _percentiles(values: list[float]) -> dict[str, float | None]:
    values.sort()
    return {f"p{q}": percentile(values, q) for q in (50, 90, 99)}


def _slo(requests: list[FinishedRecord], window_s: float) -> dict[str, float | None]:
    """Attainment: of the completed requests that had targets, the share that met them all.
    Goodput: completed requests per second that met their targets (no targets counts as met)."""
    completed = [r for r in requests if r.completed]
    judged = [r.slo_met for r in completed if r.slo_met is not None]
    good = sum(1 for r in completed if r.slo_met is not False)
    return {
        "attainment": sum(judged) / len(judged) if judged else None,
        "goodput_rps": good / window_s,
    }


def _steps(steps: list[StepRecord]) -> dict[str, float | int | None]:
    count = len(steps)
    durations = sorted(s.duration_s * 1e3 for s in steps)
    return {
        "batch_size": sum(s.num_seqs for s in steps) / count if count else 0.0,
        "prefill_tokens_per_step": sum(s.num_prefill_tokens for s in steps) / count
        if count
        else 0.0,
        "decode_tokens_per_step": sum(s.num_decode_tokens for s in steps) / count if count else 0.0,
        "step_ms_p50": percentile(durations, 50),
    }
