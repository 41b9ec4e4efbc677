"""What the front end keeps and shows of its replicas: a fresh ledger for one (at start and
after a restart), their snapshots as one engine's, and each one's status for `/v1/stats` and
`/metrics`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from baton.app.replicas.ray_replica import ReplicaInfo
from baton.core.config import EngineConfig
from baton.core.engine_stats import EngineStats, ReplicaStatus
from baton.core.replicas.disaggregation import Role
from baton.core.replicas.kv_transfer import TransferTotals
from baton.core.replicas.replica_ledger import ReplicaLedger


def new_ledger(config: EngineConfig, replica: int, info: ReplicaInfo) -> ReplicaLedger:
    return ReplicaLedger(
        replica,
        info.stats,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_wait_s=config.max_wait_ms / 1000,
        block_size=info.limits.block_size,
        num_kv_blocks=info.limits.num_kv_blocks,
    )


def combined_stats(ledgers: Sequence[ReplicaLedger]) -> EngineStats:
    """All replicas' last snapshots as one engine's: counts summed, cache usage averaged, the
    cost fit and lifetime of the first healthy replica."""
    snapshots = [ledger.stats for ledger in ledgers]
    first = next((r.stats for r in ledgers if r.healthy), snapshots[0])
    return dataclasses.replace(
        first,
        num_running=sum(s.num_running for s in snapshots),
        num_waiting=sum(s.num_waiting for s in snapshots),
        waiting_by_priority=(),
        kv_cache_usage=sum(s.kv_cache_usage for s in snapshots) / len(snapshots),
        num_steps=sum(s.num_steps for s in snapshots),
        num_preemptions=sum(s.num_preemptions for s in snapshots),
        num_kv_growth_holds=sum(s.num_kv_growth_holds for s in snapshots),
        prefix_cache_queries=sum(s.prefix_cache_queries for s in snapshots),
        prefix_cache_hits=sum(s.prefix_cache_hits for s in snapshots),
    )


def replica_statuses(
    ledgers: Sequence[ReplicaLedger],
    infos: Sequence[ReplicaInfo],
    roles: Sequence[Role],
    transfers: Sequence[TransferTotals],
) -> list[ReplicaStatus]:
    return [
        ReplicaStatus(
            ledger.replica_id,
            info.node,
            info.pid,
            ledger.healthy,
            ledger.stats,
            ledger.num_in_flight,
            ledger.num_routed,
            ledger.num_finished,
            role.value,
            received,
        )
        for ledger, info, role, received in zip(ledgers, infos, roles, transfers, strict=True)
    ]
