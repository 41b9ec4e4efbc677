"""The KV room a replica's ledger shows: how many blocks its decodes grow into over the next
steps, and what is left for a request sent there. The router's hand-off and the migration
planner both ask it, from the same ledger the TTFT forecast reads."""

from __future__ import annotations

from baton.core.kv_cache.kv_cache_manager import blocks_needed
from baton.core.replicas.replica_ledger import ReplicaLedger


def growth_blocks(replica: ReplicaLedger, horizon: int) -> int:
    """The KV blocks `replica`'s decodes grow into over the next `horizon` steps, a token
    each a step."""
    block_size = replica.block_size
    growth = 0
    for request_id, _, _ in replica.forecast.decodes():
        # Its last token's KV is written by its next step.
        held = replica.num_tokens_of(request_id) - 1
        growth += blocks_needed(held + horizon, block_size) - blocks_needed(held, block_size)
    return growth


def blocks_short(replica: ReplicaLedger, horizon: int) -> int:
    """How many more KV blocks `replica`'s decodes grow into over the next `horizon` steps
    than it has free; 0 when it has enough."""
    return max(0, growth_blocks(replica, horizon) - replica.num_free_kv_blocks)


def room_blocks(replica: ReplicaLedger, horizon: int) -> int:
    """The KV blocks a request sent to `replica` may take, its own decodes' growth over
    `horizon` steps kept: the fewer of what its snapshot shows free less what the prompts it
    owes take as they prefill, and what the requests routed there leave of its blocks once
    each holds all its tokens (hand-offs still in transit included, which no snapshot shows)."""
    block_size = replica.block_size
    owed = blocks_needed(replica.forecast.owed_tokens, block_size)
    routed = sum(
        blocks_needed(replica.num_tokens_of(request_id), block_size)
        for request_id in replica.request_ids
    )
    free = min(replica.num_free_kv_blocks - owed, replica.num_kv_blocks - routed)
    return free - growth_blocks(replica, horizon)
