"""Room to grow: a prompt starts only if the requests running and it still fit the KV pool as
they decode to their predicted lengths, each giving its blocks back when it ends.

Admission that looks only at the next chunk lets a busy engine refill every block a finished
request frees with a new prompt; a few steps later the running decodes outgrow the pool and one
is preempted: it loses its pace, and its KV is computed again. The forecast uses the
online length predictor, so it is an expectation, not a bound: a request that runs past its
prediction can still preempt, as without the check.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from baton.core.kv_cache.kv_cache_manager import KVCacheManager
from baton.core.request import Request
from baton.core.scheduling.length_predictor import LengthPredictor

# Finished requests the length predictor must have seen before its forecast holds prompts
# back: before that it predicts every answer runs to max_tokens, and an unset max_tokens is
# the whole context, so a cold server would start a handful of requests at a time.
MIN_OBSERVATIONS = 16
# A request's predicted length is kept while the predictor learns from this many more
# finished requests: predicting every running request every step would cost more than the
# rest of the step's scheduling, and the prediction moves slowly.
REPREDICT_AFTER = 64


def peak_blocks(
    tokens: Sequence[int], remaining: Sequence[int], block_size: int, window_blocks: int | None
) -> int:
    """The most blocks the requests hold at once as request i grows from `tokens[i]` by
    `remaining[i]` tokens, one a step, and then frees its blocks. The sum only grows between
    two ends, so it peaks at the step one of them ends. `window_blocks` caps what one request
    holds (a sliding window)."""
    if not tokens:
        return 0
    if window_blocks is not None:
        return _peak_blocks_windowed(tokens, remaining, block_size, window_blocks)
    # At step T request i holds ceil((n_i + T) / b) = (a_i // b) + (T // b) + [a_i % b >= b -
    # T % b] blocks, with a_i = n_i + b - 1. Sorted by remaining tokens, longest first, the
    # requests alive at an end are a prefix, so each end's sum comes from running sums of the
    # quotients and of how many residues reach each threshold.
    size = block_size
    grow = np.asarray(remaining, dtype=np.int64)
    order = np.argsort(-grow, kind="stable")
    grow = grow[order]
    shifted = np.asarray(tokens, dtype=np.int64)[order] + (size - 1)
    quotients = np.cumsum(shifted // size)
    at_least = np.zeros((len(grow), size), dtype=np.int64)  # [i, r]: residue i >= r
    at_least[np.arange(len(grow)), shifted % size] = 1
    at_least = np.cumsum(np.cumsum(at_least[:, ::-1], axis=1)[:, ::-1], axis=0)
    # The last request alive at each distinct end, and the end itself.
    last = np.flatnonzero(np.append(grow[1:] != grow[:-1], True))
    ends = grow[last]
    threshold = size - ends % size
    carried = np.where(threshold < size, at_least[last, np.minimum(threshold, size - 1)], 0)
    held = quotients[last] + (last + 1) * (ends // size) + carried
    return int(held.max())


def _peak_blocks_windowed(
    tokens: Sequence[int], remaining: Sequence[int], block_size: int, window_blocks: int
) -> int:
    """`peak_blocks` with each request's blocks capped: every end against every request."""
    start = np.asarray(tokens, dtype=np.int64)
    grow = np.asarray(remaining, dtype=np.int64)
    ends = np.unique(grow)
    held = np.minimum(-(-(start[None, :] + ends[:, None]) // block_size), window_blocks)
    alive = grow[None, :] >= ends[:, None]
    return int(np.where(alive, held, 0).sum(axis=1).max())


class GrowthForecast:
    """Predicted lengths, kept across steps, and `room()`, one step's view of the running
    requests' growth that each admission extends."""

    def __init__(self, kv_cache: KVCacheManager, predictor: LengthPredictor) -> None:
        self.kv_cache = kv_cache
        self.predictor = predictor
        self._lengths: dict[str, tuple[int, int]] = {}  # id -> (observations then, length)

    @property
    def ready(self) -> bool:
        return self.predictor.num_observations >= MIN_OBSERVATIONS

    def remaining_tokens(self, request: Request) -> int:
        """Output tokens `request` is still expected to produce (at least one)."""
        seen = self.predictor.num_observations
        kept = self._lengths.get(request.request_id)
        if kept is None or seen - kept[0] >= REPREDICT_AFTER:
            kept = seen, round(self.predictor.predict(request))
            self._lengths[request.request_id] = kept
        return max(1, kept[1] - request.num_output_tokens)

    def room(self, running: Sequence[Request]) -> GrowthRoom:
        live = {request.request_id for request in running}
        # Forget the requests that left; their ids are not reused.
        self._lengths = {k: v for k, v in self._lengths.items() if k in live}
        return GrowthRoom(self, running)


class GrowthRoom:
    """The running requests' forecast for one step. The pool's capacity for them (free blocks
    plus theirs) does not change as they allocate within the step, nor as one is admitted."""

    def __init__(self, forecast: GrowthForecast, running: Sequence[Request]) -> None:
        kv_cache = forecast.kv_cache
        self.forecast = forecast
        self.tokens = [request.num_tokens for request in running]
        self.remaining = [forecast.remaining_tokens(request) for request in running]
        self.capacity = kv_cache.pool.num_free_blocks + sum(
            kv_cache.num_held_blocks(request.request_id) for request in running
        )
        self.final = sum(
            self._blocks(n + g) for n, g in zip(self.tokens, self.remaining, strict=True)
        )

    def _member(self, request: Request, shared_blocks: int) -> tuple[int, int]:
        """Its tokens, less the shared ones (whole blocks, so its own blocks count exactly),
        and the tokens it is still expected to produce."""
        own = request.num_tokens - shared_blocks * self.forecast.kv_cache.block_size
        return own, self.forecast.remaining_tokens(request)

    def _blocks(self, num_tokens: int) -> int:
        return self.forecast.kv_cache.max_blocks_held(num_tokens, 1)

    def admits(self, request: Request, shared_blocks: int = 0) -> bool:
        """Whether `request` may start: always beside nothing (waiting frees nothing).
        `shared_blocks`: blocks of its cached prefix that running requests hold already."""
        if not self.tokens:
            return True
        n, g = self._member(request, shared_blocks)
        # The common case needs no forecast: everyone at full length at once still fits.
        if self.final + self._blocks(n + g) <= self.capacity:
            return True
        kv_cache = self.forecast.kv_cache
        window_blocks = (
            None if kv_cache.sliding_window is None else kv_cache.max_blocks_held(1 << 40, 1)
        )
        peak = peak_blocks(
            [*self.tokens, n], [*self.remaining, g], kv_cache.block_size, window_blocks
        )
        return peak <= self.capacity

    def add(self, request: Request, shared_blocks: int = 0) -> None:
        """`request` started this step."""
        n, g = self._member(request, shared_blocks)
        self.tokens.append(n)
        self.remaining.append(g)
        self.final += self._blocks(n + g)
