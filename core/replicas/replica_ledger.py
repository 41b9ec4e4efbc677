"""The front end's view of one engine replica, the only thing the router reads about it: the
stats snapshot the replica last published, and the front end's own ledger of the requests it
sent there (prefill owed, tokens held, prompt blocks brought into its prefix cache), kept up
from the per-step outputs the replica sends back, and when it last showed progress (so a hung
replica is told from an idle one). Never the replica's live queues."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from baton.core.engine_stats import EngineStats
from baton.core.kv_cache.block_pool import hash_block
from baton.core.outputs import RequestOutput
from baton.core.request import SLO
from baton.core.scheduling.ttft_forecast import Forecast, TTFTForecast


def prompt_block_hashes(prompt_token_ids: Sequence[int], block_size: int) -> tuple[bytes, ...]:
    """The chained hashes of a prompt's full blocks that the engine's prefix cache could hold:
    the engine's own `hash_block`, over every full block but one that would leave no token to
    compute (core/kv_cache/kv_cache_manager.py `cached_prefix` stops there too)."""
    num_blocks = (len(prompt_token_ids) - 1) // block_size
    hashes: list[bytes] = []
    parent = None
    for index in range(num_blocks):
        parent = hash_block(parent, prompt_token_ids[index * block_size : (index + 1) * block_size])
        hashes.append(parent)
    return tuple(hashes)


class ReplicaLedger:
    """One replica as the router sees it. Not thread-safe: the front end's one thread (the
    event loop, or the simulator) calls every method.

    The prefix record holds the block hashes of the prompts routed here, newest last, no more
    than the replica has KV blocks: the replica's cache holds at most that many, and evicts
    least recently used first, as this record does. It is the router's estimate, not the
    replica's cache, which it never reads."""

    def __init__(
        self,
        replica_id: int,
        stats: EngineStats,
        *,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_wait_s: float,
        block_size: int,
        num_kv_blocks: int,
    ) -> None:
        self.replica_id = replica_id
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        # False from a replica's death until it is back: the router sends it nothing.
        self.healthy = True
        self.forecast = TTFTForecast(
            stats.step_cost, max_num_batched_tokens, max_num_seqs, max_wait_s
        )
        self.stats = stats
        self.publish(stats)
        # Tokens each request in flight here holds or is owed: prompt plus output so far.
        self._tokens: dict[str, int] = {}
        self.num_tokens = 0
        self._prefix: OrderedDict[bytes, None] = OrderedDict()
        self.num_routed = 0
        self.num_finished = 0
        # When the replica last sent a step, or was given work while it had none.
        self.progress_at = -math.inf

    def publish(self, stats: EngineStats) -> None:
        """The replica's snapshot after a step: its cost fit and request lifetime feed the
        forecast, as on a single engine (app/engine/async_engine.py)."""
        self.stats = stats
        self.forecast.cost_model = stats.step_cost
        self.forecast.lifetime_s = stats.mean_lifetime_s

    @property
    def request_ids(self) -> list[str]:
        """The requests in flight on this replica."""
        return list(self._tokens)

    def num_tokens_of(self, request_id: str) -> int:
        """Tokens a request in flight here holds or is owed (0 if it is not here)."""
        return self._tokens.get(request_id, 0)

    @property
    def num_in_flight(self) -> int:
        return len(self._tokens)

    @property
    def max_num_seqs(self) -> int:
        return self.forecast.max_num_seqs

    @property
    def num_free_kv_blocks(self) -> int:
        """KV blocks free at the replica's last snapshot; a cached prefix's free block counts,
        as a new block evicts it."""
        return round((1.0 - self.stats.kv_cache_usage) * self.num_kv_blocks)

    def cached_blocks(self, block_hashes: Sequence[bytes]) -> int:
        """How many of a prompt's leading blocks this replica's prefix cache likely holds."""
        count = 0
        for block_hash in block_hashes:
            if block_hash not in self._prefix:
                break
            count += 1
        return count

    def predict(
        self,
        num_prompt_tokens: int,
        cached_blocks: int,
        ttft_ms: float | None,
        now: float,
        prefill_budget: int | None = None,
    ) -> Forecast:
        """The admission forecast for a request sent here, its cached blocks not recomputed;
        `prefill_budget` as `TTFTForecast.predict` takes it."""
        uncached = self._uncached(num_prompt_tokens, cached_blocks)
        return self.forecast.predict(uncached, ttft_ms, now, prefill_budget)

    def add(
        self,
        request_id: str,
        num_prompt_tokens: int,
        slo: SLO | None,
        block_hashes: Sequence[bytes],
        now: float,
    ) -> None:
        """A request routed here: it is in flight, and its prompt's blocks will be cached."""
        cached = self.cached_blocks(block_hashes)
        if not self._tokens:
            # An idle replica sends no steps: its silence until now was no stall.
            self.progress_at = now
        self.forecast.add(request_id, self._uncached(num_prompt_tokens, cached), slo, now)
        self._tokens[request_id] = num_prompt_tokens
        self.num_tokens += num_prompt_tokens
        self.num_routed += 1
        for block_hash in block_hashes:
            self._prefix[block_hash] = None
            self._prefix.move_to_end(block_hash)
        while len(self._prefix) > self.num_kv_blocks:
            self._prefix.popitem(last=False)

    def progressed(self, now: float) -> None:
        """A step message arrived from the replica."""
        self.progress_at = now

    def stalled(self, now: float, timeout_s: float) -> bool:
        """Whether the replica has had work in hand and sent no step for more than
        `timeout_s`: hung (a stopped process, a forward that never returns), not idle."""
        return self.healthy and bool(self._tokens) and now - self.progress_at > timeout_s

    def receive(self, output: RequestOutput, now: float) -> None:
        """One request's delta from a replica step: its first token settles its prefill in
        the forecast, its tokens count as held, its finish drops it."""
        if output.request_id not in self._tokens:
            return
        if output.new_token_ids:
            self.forecast.first_token(output.request_id, now)
            self._tokens[output.request_id] += len(output.new_token_ids)
            self.num_tokens += len(output.new_token_ids)
        if output.finished:
            self.num_finished += 1
            self.remove(output.request_id)

    def remove(self, request_id: str) -> None:
        """A request that ended here, or was moved away (a retry after the replica died)."""
        self.forecast.remove(request_id)
        self.num_tokens -= self._tokens.pop(request_id, 0)

    def _uncached(self, num_prompt_tokens: int, cached_blocks: int) -> int:
        return max(1, num_prompt_tokens - cached_blocks * self.block_size)
