"""Per-request block tables over the block pool: allocate on demand as sequences grow, find and
share cached prefixes, free on finish, abort or preemption, and free the blocks that have slid
out of the attention window of every layer."""

from __future__ import annotations

from collections.abc import Sequence

from baton.core.kv_cache.block_pool import BlockPool, KVBlock, hash_block
from baton.core.pooling import Pooling
from baton.core.request import Request


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def max_blocks_held(
    num_tokens: int, block_size: int, max_chunk: int, sliding_window: int | None
) -> int:
    """The most blocks a request of `num_tokens` tokens holds at once, computed in chunks of at
    most `max_chunk`: all of them, or with a sliding window the window behind a chunk, the
    chunk's, and one more where they straddle a block boundary. A function of the sizes alone,
    so request validation sizes a request without a cache."""
    needed = blocks_needed(num_tokens, block_size)
    if sliding_window is None:
        return needed
    return min(needed, blocks_needed(sliding_window - 1 + max_chunk, block_size) + 1)


class KVCacheManager:
    """`sliding_window`: when every layer of the model attends only to its last that many
    tokens, a request's blocks that fall wholly before the window of its next token are never
    read again and go back to the pool as it grows (`num_window_freed_blocks` counts them).
    Their ids stay in its block table, which the attention never reads that far back."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        sliding_window: int | None = None,
    ) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        self._blocks: dict[str, list[KVBlock]] = {}
        self._block_tables: dict[str, list[int]] = {}
        # How many leading blocks of each request are registered in the prefix cache.
        self._num_hashed: dict[str, int] = {}
        # How many leading blocks of each request were freed as out of the window.
        self._num_window_freed: dict[str, int] = {}
        self.num_window_freed_blocks = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def blocks_needed(self, num_tokens: int) -> int:
        return blocks_needed(num_tokens, self.block_size)

    def max_blocks_held(self, num_tokens: int, max_chunk: int) -> int:
        return max_blocks_held(num_tokens, self.block_size, max_chunk, self.sliding_window)

    def block_table(self, request_id: str) -> list[int]:
        return self._block_tables[request_id]

    def cached_prefix(self, request: Request) -> list[KVBlock]:
        """The longest run of the request's leading full blocks already in the cache.

        At least one token is always left to compute, because the step that computes it is the
        one that samples the next token.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        self._extend_hashes(request, max_blocks)
        hits = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def usable_prefix(self, request: Request) -> list[KVBlock]:
        """The part of `cached_prefix` the request may skip computing."""
        prefix = self.cached_prefix(request)  # also extends the request's block hashes
        if request.sampling_params.pooling is Pooling.MEAN:
            # A mean reads every position's hidden state, and a hit computes none of its own.
            return []
        scored_from = request.prompt_logprobs_from
        if scored_from is not None:
            # A hit skips computing its positions, and so their logits: a request still owed
            # prompt log-probabilities reads only the blocks before the first one it needs.
            prefix = prefix[: scored_from // self.block_size]
        return prefix

    def allocate_slots(
        self, request: Request, num_new_tokens: int, prefix: list[KVBlock] | None = None
    ) -> bool:
        """Give the request blocks for `num_new_tokens` more tokens after its computed ones.

        `prefix` is a cache hit for a request not yet holding blocks; its tokens count as
        computed. Returns False when the pool cannot cover the growth, having changed nothing
        but freeing blocks that slid out of the window.
        """
        blocks = self._blocks.get(request.request_id)
        if blocks is not None:
            self._free_out_of_window(request, blocks)
            # The common decode case: the last block still has room.
            num_tokens = request.num_computed_tokens + num_new_tokens
            if num_tokens <= len(blocks) * self.block_size:
                return True
        else:
            blocks = []
        prefix = prefix or []
        num_tokens = request.num_computed_tokens + len(prefix) * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_needed(num_tokens) - len(blocks) - len(prefix)
        # Free prefix blocks sit in the free queue; touching them takes them out of it.
        num_reclaimed = sum(1 for block in prefix if block.ref_count == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_reclaimed:
            return False
        if request.request_id not in self._blocks:
            self._blocks[request.request_id] = blocks
            self._block_tables[request.request_id] = []
            self._num_hashed[request.request_id] = len(prefix)
        table = self._block_tables[request.request_id]
        self.pool.touch(prefix)
        new_blocks = prefix + self.pool.allocate(max(num_new_blocks, 0))
        blocks.extend(new_blocks)
        table.extend(block.block_id for block in new_blocks)
        return True

    def computed_block_hashes(self, request: Request) -> tuple[bytes, ...]:
        """The chained hashes of the request's full computed blocks, as its prefix cache
        registers them: what another engine's cache needs to share them."""
        self._extend_hashes(request, request.num_computed_tokens // self.block_size)
        return tuple(request.block_hashes[: request.num_computed_tokens // self.block_size])

    def allocate_prefilled(self, request: Request, block_hashes: Sequence[bytes]) -> bool:
        """Fresh blocks for a request whose first `num_computed_tokens` were computed by another
        engine, their full blocks registered in the prefix cache under that engine's
        `block_hashes`. False, changing nothing, when the pool cannot hold them."""
        num_blocks = self.blocks_needed(request.num_computed_tokens)
        if num_blocks > self.pool.num_free_blocks:
            return False
        blocks = self.pool.allocate(num_blocks)
        self._blocks[request.request_id] = blocks
        self._block_tables[request.request_id] = [block.block_id for block in blocks]
        request.block_hashes = list(block_hashes)
        num_full = request.num_computed_tokens // self.block_size
        num_hashed = 0
        if self.enable_prefix_caching:
            self._extend_hashes(request, num_full)
            for block, block_hash in zip(blocks[:num_full], request.block_hashes, strict=False):
                self.pool.cache(block, block_hash)
            num_hashed = num_full
        self._num_hashed[request.request_id] = num_hashed
        return True

    def free_unused_tail(self, request: Request) -> None:
        """Free the blocks past those the request's tokens fill: slots allocated for draft
        tokens that verification rejected."""
        blocks = self._blocks[request.request_id]
        num_used = self.blocks_needed(request.num_tokens)
        if len(blocks) <= num_used:
            return
        tail = blocks[num_used:]
        del blocks[num_used:]
        del self._block_tables[request.request_id][num_used:]
        self.pool.free(reversed(tail))

    def cache_computed_blocks(self, request: Request) -> None:
        """Register the request's newly completed blocks so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        num_hashed = self._num_hashed[request.request_id]
        if num_full <= num_hashed:
            return
        self._extend_hashes(request, num_full)
        blocks = self._blocks[request.request_id]
        for index in range(num_hashed, num_full):
            self.pool.cache(blocks[index], request.block_hashes[index])
        self._num_hashed[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first so that shared heads outlive tails."""
        blocks = self._blocks.pop(request.request_id, None)
        if blocks is None:
            return
        del self._block_tables[request.request_id]
        del self._num_hashed[request.request_id]
        num_window_freed = self._num_window_freed.pop(request.request_id, 0)
        self.pool.free(reversed(blocks[num_window_freed:]))

    def _free_out_of_window(self, request: Request, blocks: list[KVBlock]) -> None:
        """Free the leading blocks no later token of `request` attends to."""
        if self.sliding_window is None:
            return
        # The next token sits at position num_computed_tokens and sees keys from
        # num_computed_tokens - window + 1 on: blocks ending before that are dead.
        first_needed = request.num_computed_tokens - self.sliding_window + 1
        num_dead = max(0, first_needed) // self.block_size
        if self.enable_prefix_caching:
            # Only blocks already in the prefix cache: the rest are still to be registered.
            num_dead = min(num_dead, self._num_hashed[request.request_id])
        num_freed = self._num_window_freed.get(request.request_id, 0)
        if num_dead <= num_freed:
            return
        # Freed blocks keep their hash: a later request with this prefix may still share them.
        self.pool.free(reversed(blocks[num_freed:num_dead]))
        self._num_window_freed[request.request_id] = num_dead
        self.num_window_freed_blocks += num_dead - num_freed

    def holds(self, request_id: str) -> bool:
        return request_id in self._blocks

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks `request_id` holds now (none freed out of its window)."""
        blocks = self._blocks.get(request_id)
        return 0 if blocks is None else len(blocks) - self._num_window_freed.get(request_id, 0)

    def _extend_hashes(self, request: Request, num_blocks: int) -> None:
        hashes = request.block_hashes
        size = self.block_size
        tokens = request.token_ids
        for index in range(len(hashes), num_blocks):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, tokens[index * size : (index + 1) * size]))
