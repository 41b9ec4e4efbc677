"""The KV block pool: fixed-size blocks with reference counts, a free queue that doubles as the
prefix cache's LRU list, and the map from block hash to cached block."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence


def hash_block(parent: bytes | None, token_ids: Sequence[int]) -> bytes:
    """Chained block hash: equal hashes mean equal tokens in this block and every block before."""
    digest = hashlib.sha256(parent or b"")
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class KVBlock:
    __slots__ = ("block_hash", "block_id", "ref_count")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: bytes | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, refs={self.ref_count})"


class BlockPool:
    """Owns every KV block. A block is either in use (ref_count > 0) or in the free queue.

    Free blocks that hold a cached prefix stay findable by hash until they are reused; the free
    queue hands out blocks without a hash first, then cached ones least-recently-freed first.
    """

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, KVBlock] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / len(self.blocks)

    def allocate(self, count: int) -> list[KVBlock]:
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} KV blocks, {len(self._free)} are free")
        taken = []
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                # Reusing a cached block evicts its prefix.
                del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_count = 1
            taken.append(block)
        return taken

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take another reference on cached blocks, pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; the first freed is the first evicted later."""
        for block in blocks:
            if block.ref_count <= 0:
                raise RuntimeError(f"double free of KV block {block.block_id}")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block.block_id, last=False)

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self._cached.get(block_hash)

    def cache(self, block: KVBlock, block_hash: bytes) -> bool:
        """Make `block` findable by `block_hash`; False if another block already holds it."""
        if block.block_hash is not None or block_hash in self._cached:
            return False
        block.block_hash = block_hash
        self._cached[block_hash] = block
        return True

    def free_block_ids(self) -> list[int]:
        return list(self._free)
