"""Per-request block tables over the block pool: allocate on demand as sequences grow, find and
share cached prefixes, free on finish, abort or preemption."""

from __future__ import annotations

from core.block_pool import BlockPool, KVBlock, hash_block
from core.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks: dict[str, list[KVBlock]] = {}
        self._block_tables: dict[str, list[int]] = {}
        # How many leading blocks of each request are registered in the prefix cache.
        self._num_hashed: dict[str, int] = {}

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

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

    def allocate_slots(
        self, request: Request, num_new_tokens: int, prefix: list[KVBlock] | None = None
    ) -> bool:
        """Give the request blocks for `num_new_tokens` more tokens after its computed ones.

        `prefix` is a cache hit for a request not yet holding blocks; its tokens count as
        computed. Returns False, changing nothing, when the pool cannot cover the growth.
        """
        blocks = self._blocks.get(request.request_id)
        if blocks is not None:
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
        self.pool.free(reversed(blocks))

    def holds(self, request_id: str) -> bool:
        return request_id in self._blocks

    def _extend_hashes(self, request: Request, num_blocks: int) -> None:
        hashes = request.block_hashes
        size = self.block_size
        tokens = request.token_ids
        for index in range(len(hashes), num_blocks):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, tokens[index * size : (index + 1) * size]))
