"""The front end's side of prefill and decode apart (`--prefill-replicas`): a request prefilled
on one replica continues on another. The prefill replica puts the prompt's KV into Ray's object
store as it hands the request off, and frees its blocks then; its step message carries the
object's reference, which the front end hands to the decode replica, so the bytes go from
replica to replica without passing through the front end. Each move's record goes to the
request's trace and to the totals `/v1/stats` and `/metrics` show."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import ray
from ray.exceptions import RayError, RayTaskError

from baton.core.prefilled import PrefilledRequest
from baton.core.replicas.kv_transfer import KVHandOff, TransferTotals

logger = logging.getLogger("baton.replicas")
# Why a move failed when the prefill replica could not read the KV (its log says more).
UNREAD = "the prefill replica could not read the KV"


class KVHandOffs:
    """Moves prefilled requests onto the replicas `actors` (Ray actor handles, indexed by
    replica id) and keeps the transfer totals, in all and of each replica by those it received;
    lives on the front end's event loop."""

    def __init__(self, actors: Sequence[ray.actor.ActorHandle]) -> None:
        self.actors = actors
        self.totals = [TransferTotals() for _ in actors]
        self.total = TransferTotals()
        # Each moved request's record until it finishes, for its trace.
        self.records: dict[str, KVHandOff] = {}

    async def move(
        self, prefilled: PrefilledRequest, kv: ray.ObjectRef | None, source: int, target: int
    ) -> KVHandOff:
        """Have replica `target` decode `prefilled` from `kv`, the KV replica `source` put in
        the object store; the record says how it went."""
        request_id = prefilled.request_id
        started = time.monotonic()
        num_bytes, error = 0, UNREAD
        if kv is not None:
            try:
                num_bytes = await self.actors[target].add_prefilled.remote(prefilled, kv)
                error = None
            except RayTaskError as failure:
                error = repr(failure.cause)
            except RayError as failure:
                # Ray's own failures (an actor or an object lost) say what happened first.
                error = (str(failure).strip().splitlines() or [repr(failure)])[0]
        if error is not None:
            logger.error(
                "moving request %s from replica %d to %d failed: %s",
                request_id,
                source,
                target,
                error,
            )
        record = KVHandOff(request_id, source, target, num_bytes, started, time.monotonic(), error)
        failed = error is not None
        self.total = self.total.plus(num_bytes, record.seconds, failed)
        self.totals[target] = self.totals[target].plus(num_bytes, record.seconds, failed)
        if not failed:
            self.records[request_id] = record
        return record

    def finished(self, request_id: str) -> KVHandOff | None:
        """The record of a finished request's move, if it moved; forgotten here."""
        return self.records.pop(request_id, None)
