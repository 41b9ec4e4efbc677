"""The front end's side of prefill and decode apart (`--prefill-replicas`): a request prefilled
on one replica continues on another. The prefill replica's actor returns the prompt's KV into
Ray's object store; the front end hands the decode replica that object's reference, so the
bytes go from replica to replica without passing through the front end; then the prefill
replica frees its blocks, whether the transfer worked or not. Each transfer's record goes to the
request's trace and to the totals `/v1/stats` and `/metrics` show."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import ray
from ray.exceptions import RayError

from baton.core.prefilled import PrefilledRequest
from baton.core.replicas.kv_transfer import KVHandOff, TransferTotals

logger = logging.getLogger("baton.replicas")


class KVHandOffs:
    """Moves prefilled requests between the replicas `actors` (Ray actor handles, indexed by
    replica id) and keeps the transfer totals, in all and of each replica by those it received;
    lives on the front end's event loop."""

    def __init__(self, actors: Sequence[ray.actor.ActorHandle]) -> None:
        self.actors = actors
        self.totals = [TransferTotals() for _ in actors]
        self.total = TransferTotals()
        # Each moved request's record until it finishes, for its trace.
        self.records: dict[str, KVHandOff] = {}

    def read_kv(self, replica: int, request_id: str) -> ray.ObjectRef:
        """Ask `replica` for a handed-off request's KV; the reference resolves where it is
        used."""
        return self.actors[replica].read_prefilled_kv.remote(request_id)

    async def move(self, prefilled: PrefilledRequest, source: int, target: int) -> KVHandOff:
        """Move `prefilled`'s KV from replica `source` to `target`, which decodes it from
        there; `source` frees its blocks after, the transfer done or failed."""
        request_id = prefilled.request_id
        started = time.monotonic()
        num_bytes, error = 0, None
        try:
            kv = self.read_kv(source, request_id)
            num_bytes = await self.actors[target].add_prefilled.remote(prefilled, kv)
        except RayError as failure:
            error = str(failure).strip().splitlines()[-1] if str(failure).strip() else repr(failure)
            logger.error(
                "moving request %s's KV from replica %d to %d failed: %s",
                request_id,
                source,
                target,
                error,
            )
        finally:
            self.actors[source].release_prefilled.remote(request_id)
        record = KVHandOff(request_id, source, target, num_bytes, started, time.monotonic(), error)
        self.total = self.total.plus(num_bytes, record.seconds, error is not None)
        self.totals[target] = self.totals[target].plus(num_bytes, record.seconds, error is not None)
        if error is None:
            self.records[request_id] = record
        return record

    def finished(self, request_id: str) -> KVHandOff | None:
        """The record of a finished request's move, if it moved; forgotten here."""
        return self.records.pop(request_id, None)
