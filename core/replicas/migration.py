"""Live migration of running decodes between replicas (`--migrate auto`, after Llumnix, OSDI
'24). Two triggers: a replica's decodes run past the tightest TPOT target among them even in
steps that carry only the least prefill the `slo` planner lets through; or its free KV blocks
fall short of what its decodes grow into before a move asked now could free any, so it is about
to preempt one. Either way one decode moves to a replica with a free place and room for its
blocks, where a step with it (beside every prompt owed there; for a move for blocks, beside the
planner's least prefill), plus its transfer spread over the decode it is expected still to do
(the lifetime forecast), keeps every target. The move rides the prefill hand-off: the source
hands the request off at its next token (`Engine.migrate`) and its KV moves as a prefilled
prompt's does.

Read from the router's ledgers and forecast alone, as every placement is. Hysteresis: a request
moves at most once, a replica takes part in one move at a time (as source or target), a request
past its expected lifetime is near its end and stays, and a move for blocks leaves its target
more room than its source.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from baton.core.kv_cache.kv_cache_manager import blocks_needed
from baton.core.replicas.disaggregation import DisaggregatingRouter, Role
from baton.core.replicas.kv_room import blocks_short, room_blocks
from baton.core.replicas.replica_ledger import ReplicaLedger
from baton.core.request import SLO
from baton.core.scheduling.feasibility import MIN_CAPPED_PREFILL

MIGRATE_MODES = ("auto", "never")


@dataclass(frozen=True, slots=True)
class Migration:
    """Move `request_id`'s decoding from replica `source` to replica `target`."""

    request_id: str
    source: int
    target: int


class MigrationPlanner:
    """Chooses the moves over `router`'s replicas under `mode` (`MIGRATE_MODES`), and keeps the
    moves asked for until they end. Not thread-safe, as the router it reads."""

    def __init__(self, router: DisaggregatingRouter, mode: str) -> None:
        if mode not in MIGRATE_MODES:
            raise ValueError(f"--migrate must be one of {', '.join(MIGRATE_MODES)}, got {mode!r}")
        self.router = router
        self.enabled = mode == "auto"
        # Asked for and not yet ended (landed, failed, or the request finished first).
        self._pending: dict[str, Migration] = {}
        # Requests that moved or are moving, until they finish: none moves twice.
        self._moved: set[str] = set()

    def asked(self, move: Migration) -> None:
        """The source was asked to hand `move`'s request off: it is moving until it `ended`."""
        self._pending[move.request_id] = move
        self._moved.add(move.request_id)

    def target_of(self, request_id: str) -> int | None:
        """The replica a request handed off for a move is going to; None if it is not moving."""
        move = self._pending.get(request_id)
        return None if move is None else move.target

    def hand_off(
        self, request_id: str, num_tokens: int, slo: SLO, source: int, now: float
    ) -> int | None:
        """The replica a request that replica `source` handed off with `num_tokens` for a move
        goes to (back to `source` if that one is down now), recorded in its ledger as decoding;
        None for a request not moving (a prefilled one: `DisaggregatingRouter.hand_off`)."""
        target = self.target_of(request_id)
        if target is None:
            return None
        ledger = self.router.router.replicas[target]
        if not ledger.healthy:
            ledger = self.router.router.replicas[source]
        ledger.add(request_id, num_tokens, slo, (), now)
        ledger.forecast.first_token(request_id, now)
        return ledger.replica_id

    def ended(self, request_id: str) -> None:
        """The move of `request_id` ended: its KV landed, the move failed, or the source
        refused it (`Engine.migrate`); it does not move again."""
        self._pending.pop(request_id, None)

    def finished(self, request_id: str) -> None:
        """`request_id` finished, wherever it was: nothing of it is kept."""
        self._pending.pop(request_id, None)
        self._moved.discard(request_id)

    def choose(self, source_id: int, now: float) -> Migration | None:
        """The move that relieves replica `source_id`, if it is about to miss a target or to
        run short of KV blocks and a move keeps every target where it lands; changes nothing
        (`asked` records it)."""
        if not self.enabled:
            return None
        replicas = self.router.router.replicas
        source = replicas[source_id]
        busy = {m.source for m in self._pending.values()} | {
            m.target for m in self._pending.values()
        }
        if source_id in busy or not source.healthy:
            return None
        horizon = self._relief_steps(source)
        # A decode behind pace lands only where every prompt owed there still fits beside it
        # (see `_landing_step_s`); one moved for blocks, whose stay would cost a preemption,
        # only where the target keeps its targets at the planner's least prefill.
        least_prefill = not _misses_target(source)
        short = 0
        if not least_prefill:
            order = _tightest_first
        else:
            short = blocks_short(source, horizon)
            if short == 0:
                return None
            order = _relief_order(short, source.block_size)
        targets = [
            replica
            for replica in replicas
            if replica is not source
            and replica.healthy
            and replica.replica_id not in busy
            and self.router.roles[replica.replica_id] is not Role.PREFILL
            and replica.num_in_flight < replica.max_num_seqs
        ]
        if not targets:
            return None
        room = {target.replica_id: room_blocks(target, horizon) for target in targets}
        lifetime_s = source.forecast.lifetime_s
        decodes = sorted(
            (order(tpot_s, source.num_tokens_of(request_id)), request_id, first_token_s, tpot_s)
            for request_id, first_token_s, tpot_s in source.forecast.decodes()
            if request_id not in self._moved
        )
        for _, request_id, first_token_s, tpot_s in decodes:
            remaining_s = lifetime_s - (now - first_token_s)
            if remaining_s <= 0:
                continue  # near its end: a move would cost more than it saves
            num_tokens = source.num_tokens_of(request_id)
            held = blocks_needed(num_tokens + horizon, source.block_size)
            # Moved for blocks, it leaves its target more room than its source then has (by
            # `held` less the shortfall): else the move only swaps which one runs short.
            needed = max(held, 2 * held - short) if short else held
            landings = [target for target in targets if room[target.replica_id] >= needed]
            target = self._landing(landings, num_tokens, tpot_s, remaining_s, least_prefill)
            if target is not None:
                return Migration(request_id, source_id, target.replica_id)
        return None

    def _relief_steps(self, source: ReplicaLedger) -> int:
        """Steps of `source` before a move asked now frees its blocks: the hand-off step, the
        transfer of its largest decode (in its shortest, decode-only steps), and the step after
        (when the blocks are back)."""
        decodes = source.forecast.decodes()
        tokens = [source.num_tokens_of(request_id) for request_id, _, _ in decodes]
        step_s = source.stats.step_cost.predict_step(0, len(tokens), sum(tokens))
        transfer_s = self.router.transfer_s(max(tokens, default=0))
        return 2 + (math.ceil(transfer_s / step_s) if step_s > 0 else 1)

    def _landing(
        self,
        targets: list[ReplicaLedger],
        num_tokens: int,
        tpot_s: float,
        remaining_s: float,
        least_prefill: bool,
    ) -> ReplicaLedger | None:
        """Of `targets`, the one with the shortest step once a decode of `num_tokens` lands
        there, among those where that step, with the transfer's delay spread over the
        `remaining_s` it is expected to decode, keeps its `tpot_s` and every target there
        (`least_prefill`: that step carries only the planner's least prefill)."""
        transfer_s = self.router.transfer_s(num_tokens)
        best: tuple[float, int, ReplicaLedger] | None = None
        for target in targets:
            step_s = _landing_step_s(target, num_tokens, least_prefill)
            intervals = max(1.0, remaining_s / step_s) if step_s > 0 else 1.0
            allowed_s = min(tpot_s, min(target.forecast.tpot_targets(), default=math.inf))
            if step_s + transfer_s / intervals > allowed_s:
                continue
            if best is None or (step_s, target.num_tokens) < best[:2]:
                best = (step_s, target.num_tokens, target)
        return None if best is None else best[2]


def _misses_target(replica: ReplicaLedger) -> bool:
    """Whether `replica`'s decodes run past their tightest TPOT target even in steps carrying
    only the least prefill the planner lets through beside them (`MIN_CAPPED_PREFILL`): the
    cap cannot keep that target, and every step misses it."""
    decodes = replica.forecast.decodes()
    tightest_s = min((tpot_s for _, _, tpot_s in decodes), default=math.inf)
    if tightest_s == math.inf:
        return False
    owed = min(replica.forecast.owed_tokens, MIN_CAPPED_PREFILL)
    context = sum(replica.num_tokens_of(request_id) for request_id, _, _ in decodes)
    return replica.stats.step_cost.predict_step(owed, len(decodes), context) > tightest_s


def _tightest_first(tpot_s: float, num_tokens: int) -> tuple[float, int]:
    """The order a replica missing its target tries its decodes in: the tightest targets
    first (they are the ones missing), then the least KV to move."""
    return (tpot_s, num_tokens)


def _relief_order(short: int, block_size: int) -> Callable[[float, int], tuple[bool, int]]:
    """The order a replica `short` of blocks tries its decodes in: first those whose blocks
    cover the shortfall, the fewest tokens first (the least to transfer and for a target to
    hold); then the rest, the most first (the most relief one move can give)."""

    def key(_: float, num_tokens: int) -> tuple[bool, int]:
        covers = blocks_needed(num_tokens, block_size) >= short
        return (not covers, num_tokens if covers else -num_tokens)

    return key


def _landing_step_s(replica: ReplicaLedger, num_tokens: int, least_prefill: bool) -> float:
    """A step on `replica` once a decode of `num_tokens` lands there beside its decodes and
    every prompt it owes (up to a step's token budget): a move that kept the decodes' targets
    only by holding those prompts back under the cap would cost them their first tokens. With
    `least_prefill`, beside only the least prefill the planner lets through."""
    decodes = replica.forecast.decodes()
    context = sum(replica.num_tokens_of(request_id) for request_id, _, _ in decodes)
    most = MIN_CAPPED_PREFILL if least_prefill else replica.forecast.max_num_batched_tokens
    owed = min(replica.forecast.owed_tokens, most)
    return replica.stats.step_cost.predict_step(owed, len(decodes) + 1, context + num_tokens)
