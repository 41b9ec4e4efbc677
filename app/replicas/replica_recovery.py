"""What the front end does when a replica dies or hangs (`baton serve --replicas N`): the router
stops sending to it at once, its requests that had sent no token run on another replica, the
others end with a clean error, and it rejoins with a fresh ledger once Ray has restarted it and
it answers. A hung replica (a stopped process, a forward that never returns) is found by its
ledger: it holds requests and has sent no step for `--replica-stall-timeout`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence

import ray
from ray.exceptions import RayError

from baton.app.replicas.ray_replica import ReplicaInfo
from baton.app.replicas.replica_views import new_ledger
from baton.app.replicas.request_table import RequestTable
from baton.core.config import EngineConfig
from baton.core.replicas.disaggregation import DisaggregatingRouter
from baton.core.replicas.migration import MigrationPlanner
from baton.core.replicas.router import NoReplicaError
from baton.core.request import EngineRequest

logger = logging.getLogger("baton.replicas")
# How long a restarting replica may take to answer before the front end asks again.
REJOIN_WAIT_S = 60.0
# What a request on a replica that died is told; one that had sent nothing is retried instead.
REPLICA_DIED = (
    "the engine replica serving this request stopped; the tokens sent so far are all there "
    "will be: send the request again"
)


class ReplicaRecovery:
    """Recovery of the replicas `actors` (Ray actor handles by replica id; `infos` kept current
    as they come back) as `placement`'s router sees them, for the requests in `table`: `resend`
    places a request again, `stopped` says the server is stopping."""

    def __init__(
        self,
        actors: Sequence[ray.actor.ActorHandle],
        infos: list[ReplicaInfo],
        config: EngineConfig,
        placement: DisaggregatingRouter,
        table: RequestTable,
        migration: MigrationPlanner,
        resend: Callable[[EngineRequest], None],
        stopped: Callable[[], bool],
    ) -> None:
        self.actors = actors
        self.infos = infos
        self.config = config
        self.placement = placement
        self.table = table
        self.migration = migration
        self.resend = resend
        self.stopped = stopped

    def lost(self, replica: int) -> None:
        """Replica `replica` died or hung: the router stops sending to it at once; its requests
        that sent no token go to another replica, the others end with a clean error."""
        replicas = self.placement.router.replicas
        old = replicas[replica]
        fresh = new_ledger(self.config, replica, self.infos[replica])
        fresh.healthy = False
        replicas[replica] = fresh
        for request_id in old.request_ids:
            self.table.replica_of.pop(request_id, None)
            self.migration.finished(request_id)
            retry = self.table.unanswered.pop(request_id, None)
            if request_id not in self.table.streams:
                continue
            if retry is not None:
                try:
                    self.resend(retry)
                    logger.info("request %s moved off replica %d", request_id, replica)
                    continue
                except NoReplicaError:
                    pass
            self.table.end_with_error(request_id, REPLICA_DIED)

    async def rejoin(self, replica: int) -> None:
        """Wait until Ray has restarted the replica and it answers; then route to it again."""
        while not self.stopped():
            try:
                info = await asyncio.wait_for(
                    self.actors[replica].info.remote(), timeout=REJOIN_WAIT_S
                )
            except (RayError, asyncio.TimeoutError):
                await asyncio.sleep(1.0)
                continue
            self.infos[replica] = info
            self.placement.router.replicas[replica] = new_ledger(self.config, replica, info)
            logger.info("engine replica %d is back (pid %d)", replica, info.pid)
            return

    async def watch(self, stall_timeout_s: float, moving: Counter[int]) -> None:
        """Find the replicas that hold requests but have sent no step within `stall_timeout_s`
        (none with KV moving to it, `moving`, which it cannot be slow at yet): their requests
        move or end as a dead replica's do, and Ray restarts them; the task reading its steps
        then sees the death and waits for the replica to rejoin."""
        period = min(1.0, stall_timeout_s / 4)
        while not self.stopped():
            await asyncio.sleep(period)
            now = time.monotonic()
            for ledger in list(self.placement.router.replicas):
                replica = ledger.replica_id
                if moving[replica] or not ledger.stalled(now, stall_timeout_s):
                    continue
                logger.error(
                    "engine replica %d sent no step for %.1f s with %d requests in hand "
                    "(--replica-stall-timeout): restarting it",
                    replica,
                    now - ledger.progress_at,
                    ledger.num_in_flight,
                )
                self.lost(replica)
                ray.kill(self.actors[replica], no_restart=False)
