"""The front end's moves of requests between replicas: a split request's at its first token
(`--prefill-replicas`, placed by core/replicas/disaggregation.py) and a running decode's live
migration at its next (`--migrate auto`, chosen by core/replicas/migration.py after each step
message). The source replica's step message carries the request's state and its KV's object
reference; the target is chosen here, the KV moved by app/replicas/kv_handoff.py, and a move
that fails ends its request alone with a clean error."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine

import ray

from baton.app.replicas.kv_handoff import KVHandOffs
from baton.app.replicas.request_table import RequestTable
from baton.core.prefilled import PrefilledRequest
from baton.core.replicas.disaggregation import DisaggregatingRouter
from baton.core.replicas.migration import Migration, MigrationPlanner
from baton.core.replicas.replica_ledger import ReplicaLedger
from baton.core.replicas.router import NoReplicaError

logger = logging.getLogger("baton.replicas")
# What a request whose KV could not move to its decode replica is told.
TRANSFER_FAILED = (
    "moving this request from its prefill replica to a decode replica failed; the tokens sent "
    "so far are all there will be: send the request again"
)
# What a request whose live migration to another replica failed is told.
MIGRATION_FAILED = (
    "moving this request's decoding to a less loaded replica failed; the tokens sent so far "
    "are all there will be: send the request again"
)


class ReplicaMoves:
    """Moves over `placement`'s replicas for the requests in `table`; `fail(request_id,
    message)` ends one where it is (the engine's, which also stops it on its replica)."""

    def __init__(
        self,
        table: RequestTable,
        placement: DisaggregatingRouter,
        migration: MigrationPlanner,
        hand_offs: KVHandOffs,
        fail: Callable[[str, str], None],
        timeout_s: float,
    ) -> None:
        self.table = table
        self.placement = placement
        self.migration = migration
        self.hand_offs = hand_offs
        self.fail = fail
        self.timeout_s = timeout_s
        self._tasks: set[asyncio.Task] = set()
        # KV moves in flight to each replica: what it holds but cannot yet be slow at.
        self.moving: Counter[int] = Counter()

    @property
    def ledgers(self) -> list[ReplicaLedger]:
        return self.placement.router.replicas

    def after_step(self, replica: int, now: float) -> None:
        """Replica `replica` sent a step: if one of its decodes should move, have the replica
        hand it off at its next token (its step message then carries it to `hand_off`)."""
        move = self.migration.choose(replica, now)
        if move is not None and move.request_id in self.table.streams:
            self._ask(move)

    def hand_off(
        self, source: int, prefilled: PrefilledRequest, kv: ray.ObjectRef | None, now: float
    ) -> None:
        """Replica `source` sent a split request's first token, or a migrating request's next
        one, and put its KV in the object store (`kv`): choose its decode replica (a migration's
        was chosen already) and move it there; a request no decode replica can take ends with a
        clean error."""
        request_id = prefilled.request_id
        self.ledgers[source].remove(request_id)
        if request_id not in self.table.streams:
            self.migration.ended(request_id)
            return
        try:
            num_tokens = prefilled.num_computed_tokens + 1
            slo = prefilled.request.slo
            target = self.migration.hand_off(request_id, num_tokens, slo, source, now)
            if target is None:
                target = self.placement.hand_off(
                    request_id,
                    prefilled.num_prompt_tokens,
                    slo,
                    prefilled.block_hashes,
                    source,
                    now,
                )
        except NoReplicaError as error:
            self.table.replica_of.pop(request_id, None)
            self.table.end_with_error(request_id, f"{error}; {TRANSFER_FAILED}")
            return
        self.table.replica_of[request_id] = target
        self.moving[target] += 1
        self._run(self._move(prefilled, kv, source, target))

    def _ask(self, move: Migration) -> None:
        self.migration.asked(move)

        async def ask() -> None:
            if not await self.hand_offs.ask_to_migrate(move.source, move.request_id):
                self.migration.ended(move.request_id)

        self._run(ask())

    async def _move(
        self, prefilled: PrefilledRequest, kv: ray.ObjectRef | None, source: int, target: int
    ) -> None:
        request_id = prefilled.request_id
        try:
            record = await self.hand_offs.move(prefilled, kv, source, target, self.timeout_s)
        except Exception:
            # Whatever went wrong, the request ends: a move that raised would leave it waiting.
            logger.exception("moving request %s to replica %d failed", request_id, target)
            record = None
        finally:
            # The stall timeout runs from the move's end: a slow move is the move's to time out.
            self.moving[target] -= 1
            self.ledgers[target].progressed(time.monotonic())
            self.migration.ended(request_id)
        if record is None or record.error is not None:
            # Unless the decode replica's death has ended the request already.
            if self.table.replica_of.get(request_id) == target:
                self.fail(request_id, MIGRATION_FAILED if prefilled.migrated else TRANSFER_FAILED)
            return
        # Placement counts the link as measured, not as the flags modelled it.
        self.placement.transfer = self.hand_offs.link.current
        if request_id not in self.table.streams:
            # Its client left while it moved: the abort went ahead of it.
            self.hand_offs.actors[target].abort.remote(request_id)

    def _run(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
