"""Block pool and prefix cache: hypothesis state machine over allocate / grow / share-by-prefix /
free / evict, plus the eviction order pinned by hand."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from baton.core.kv_cache.block_pool import BlockPool, hash_block
from baton.core.kv_cache.kv_cache_manager import KVCacheManager
from baton.core.request import Request
from tests.factory import make_core_request

BLOCK_SIZE = 4
NUM_BLOCKS = 24


def test_hash_chain_depends_on_every_earlier_block():
    first = hash_block(None, [1, 2, 3, 4])
    assert hash_block(first, [5, 6, 7, 8]) != hash_block(
        hash_block(None, [9, 2, 3, 4]), [5, 6, 7, 8]
    )
    assert hash_block(first, [5, 6, 7, 8]) == hash_block(
        hash_block(None, [1, 2, 3, 4]), [5, 6, 7, 8]
    )


def test_unhashed_blocks_are_reused_before_cached_ones_and_lru_order_holds():
    pool = BlockPool(4)
    a, b, c, _held = pool.allocate(4)
    pool.cache(a, b"a")
    pool.cache(b, b"b")
    pool.free([b, a])  # b freed first: evicted first
    pool.free([c])  # unhashed: handed out before any cached block
    assert [blk.block_id for blk in pool.allocate(1)] == [c.block_id]
    assert pool.lookup(b"b") is b
    assert [blk.block_id for blk in pool.allocate(1)] == [b.block_id]
    assert pool.lookup(b"b") is None, "reusing a cached block evicts its hash"
    assert pool.lookup(b"a") is a


def test_double_free_is_refused():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.free([block])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([block])


def test_allocation_that_does_not_fit_changes_nothing():
    kv = KVCacheManager(4, BLOCK_SIZE, enable_prefix_caching=True)
    request = make_core_request("r", list(range(20)))
    assert not kv.allocate_slots(request, 20)
    assert kv.pool.num_free_blocks == 4 and not kv.holds("r")


def test_cached_prefix_returns_the_same_blocks_and_leaves_a_token_to_compute():
    kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
    first = make_core_request("a", list(range(12)))
    assert kv.allocate_slots(first, 12)
    first.num_computed_tokens = 12
    kv.cache_computed_blocks(first)
    same = make_core_request("b", list(range(12)))
    # 12 tokens = 3 full blocks, but the last token must be recomputed: 2 blocks hit.
    assert [b.block_id for b in kv.cached_prefix(same)] == kv.block_table("a")[:2]
    longer = make_core_request("c", [*range(12), 99])
    hit = kv.cached_prefix(longer)
    assert [b.block_id for b in hit] == kv.block_table("a")
    assert kv.allocate_slots(longer, 1, hit)
    assert kv.block_table("c")[:3] == kv.block_table("a")
    kv.free(first)
    kv.free(longer)
    assert kv.pool.num_free_blocks == NUM_BLOCKS


class BlockPoolMachine(RuleBasedStateMachine):
    """Random request lifetimes over a small pool; the pool's books must always balance."""

    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        self.live: dict[str, Request] = {}
        self.counter = 0

    def _new_id(self) -> str:
        self.counter += 1
        return f"r{self.counter}"

    @rule(target=requests, tokens=st.lists(st.integers(0, 3), min_size=1, max_size=30))
    def allocate(self, tokens):
        """Admit a request with its prefix hit, as the scheduler does."""
        request = make_core_request(self._new_id(), tokens)
        hit = self.kv.cached_prefix(request)
        num_hit = len(hit) * BLOCK_SIZE
        if self.kv.allocate_slots(request, len(tokens) - num_hit, hit):
            request.num_computed_tokens = len(tokens)
            self.kv.cache_computed_blocks(request)
            self.live[request.request_id] = request
            table = self.kv.block_table(request.request_id)
            assert table[: len(hit)] == [b.block_id for b in hit]
        return request.request_id

    @rule(request_id=requests, extra=st.lists(st.integers(0, 3), min_size=1, max_size=9))
    def append(self, request_id, extra):
        request = self.live.get(request_id)
        if request is None:
            return
        for token in extra:
            request.append_token(token)
        if self.kv.allocate_slots(request, len(extra)):
            request.num_computed_tokens = request.num_tokens
            self.kv.cache_computed_blocks(request)
        else:
            del request.token_ids[-len(extra) :]

    @rule(request_id=requests)
    def fork_by_prefix(self, request_id):
        """A new request with the same tokens reuses cached blocks with the same contents, at
        least as far as the source's own blocks are the cached copies.

        The source may hold a duplicate of a block another request computed first (only one
        copy of a hash is findable); that copy can be evicted once its owner is gone, so the
        hit may end there, but it never returns a block with different contents."""
        source = self.live.get(request_id)
        if source is None:
            return
        fork = make_core_request(self._new_id(), list(source.token_ids))
        hit = self.kv.cached_prefix(fork)
        full = (source.num_tokens - 1) // BLOCK_SIZE
        assert len(hit) <= full
        assert [b.block_hash for b in hit] == source.block_hashes[: len(hit)]
        held = 0
        for block_id, block_hash in zip(
            self.kv.block_table(request_id)[:full], source.block_hashes[:full], strict=True
        ):
            cached = self.kv.pool.lookup(block_hash)
            if cached is None or cached.block_id != block_id:
                break
            held += 1
        assert len(hit) >= held
        assert [b.block_id for b in hit[:held]] == self.kv.block_table(request_id)[:held]
        if self.kv.allocate_slots(fork, fork.num_tokens - len(hit) * BLOCK_SIZE, hit):
            fork.num_computed_tokens = fork.num_tokens
            self.kv.cache_computed_blocks(fork)
            self.live[fork.request_id] = fork

    @rule(request_id=requests)
    def free(self, request_id):
        request = self.live.pop(request_id, None)
        if request is not None:
            self.kv.free(request)
            assert not self.kv.holds(request_id)

    @precondition(lambda self: not self.live)
    @rule()
    def evict_everything(self):
        """With nothing live, the whole pool is allocatable again (cached blocks get evicted)."""
        blocks = self.kv.pool.allocate(NUM_BLOCKS)
        assert self.kv.pool.num_cached_blocks == 0
        self.kv.pool.free(blocks)

    @invariant()
    def free_plus_used_is_total(self):
        pool = self.kv.pool
        used = [b for b in pool.blocks if b.ref_count > 0]
        assert pool.num_free_blocks + len(used) == NUM_BLOCKS
        free_ids = set(pool.free_block_ids())
        assert all(b.ref_count == 0 for b in pool.blocks if b.block_id in free_ids)

    @invariant()
    def ref_counts_match_block_tables(self):
        refs = [0] * NUM_BLOCKS
        for request_id in self.live:
            for block_id in self.kv.block_table(request_id):
                refs[block_id] += 1
        assert refs == [b.ref_count for b in self.kv.pool.blocks]

    @invariant()
    def cached_hashes_point_at_their_blocks(self):
        for block in self.kv.pool.blocks:
            if block.block_hash is not None:
                assert self.kv.pool.lookup(block.block_hash) is block


BlockPoolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
test_block_pool_state_machine = BlockPoolMachine.TestCase
