"""The front end's side of prefill and decode apart (`--prefill-replicas`): a request prefilled
on one replica continues on another. The prefill replica puts the prompt's KV into Ray's object
store as it hands the request off, and frees its blocks then; its step message carries the
object's reference, which the front end hands to the decode replica, so the bytes go from
replica to replica without passing through the front end. A running decode's live migration
(core/replicas/migration.py) moves the same way. Each move's record goes to the request's trace
and to the totals `/v1/stats` and `/metrics` show."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import ray
from ray.exceptions import RayError, RayTaskError

from baton.core.prefilled import PrefilledRequest
from baton.core.replicas.kv_transfer import KVHandOff, TransferCost, TransferFit, TransferTotals

logger = logging.getLogger("baton.replicas")
# Why a move failed when the prefill replica could not read the KV (its log says more).
UNREAD = "the prefill replica could not read the KV"


class KVHandOffs:
    """Moves prefilled requests onto the replicas `actors` (Ray actor handles, indexed by
    replica id), fits the link to the moves (`link`, from the flags' `prior`) and keeps the
    transfer totals, in all and of each replica by those it received; lives on the front end's
    event loop."""

    def __init__(self, actors: Sequence[ray.actor.ActorHandle], prior: TransferCost) -> None:
        self.actors = actors
        self.link = TransferFit(prior)
        self.totals = [TransferTotals() for _ in actors]
        self.total = TransferTotals()
        # Each moved request's records until it finishes, for its trace: its move at its first
        # token, and its live migration.
        self.records: dict[str, KVHandOff] = {}
        self.migrations: dict[str, KVHandOff] = {}

    async def move(
        self,
        prefilled: PrefilledRequest,
        kv: ray.ObjectRef | None,
        source: int,
        target: int,
        timeout_s: float,
    ) -> KVHandOff:
        """Have replica `target` decode `prefilled` from `kv`, the KV replica `source` put in
        the object store, within `timeout_s`; the record says how it went."""
        request_id = prefilled.request_id
        started = time.monotonic()
        num_bytes, error = 0, UNREAD
        if kv is not None:
            try:
                added = asyncio.wrap_future(
                    self.actors[target].add_prefilled.remote(prefilled, kv).future()
                )
                # Not `wait_for`: it would wait on for a cancellation Ray may never act on.
                await asyncio.wait({added}, timeout=timeout_s)
                if not added.done():
                    added.cancel()
                    raise TimeoutError
                num_bytes = added.result()
                error = None
            except TimeoutError:
                error = f"the decode replica took no KV within {timeout_s:g} s"
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
        migration = prefilled.migrated
        record = KVHandOff(
            request_id, source, target, num_bytes, started, time.monotonic(), error, migration
        )
        failed = error is not None
        self.total = self.total.plus(num_bytes, record.seconds, failed, migration)
        self.totals[target] = self.totals[target].plus(num_bytes, record.seconds, failed, migration)
        if not failed:
            (self.migrations if migration else self.records)[request_id] = record
            self.link.observe(num_bytes, record.seconds)
        return record

    async def ask_to_migrate(self, source: int, request_id: str) -> bool:
        """Ask replica `source` to hand `request_id` off at its next token; False when it
        will not (it no longer runs it) or cannot be reached."""
        try:
            reply = self.actors[source].migrate.remote(request_id)
            return await asyncio.wrap_future(reply.future())
        except RayError:
            return False

    def finished(self, request_id: str) -> tuple[KVHandOff | None, KVHandOff | None]:
        """The records of a finished request's move at its first token and of its live
        migration, where it had them; forgotten here."""
        return self.records.pop(request_id, None), self.migrations.pop(request_id, None)
