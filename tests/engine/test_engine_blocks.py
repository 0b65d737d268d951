"""Block pool (LRU free queue with lazy deletion) and block keys, in isolation."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokenomy.engine import run_slots
from tokenomy.engine.block_ids import BlockIds
from tokenomy.engine.block_keys import KeyChain
from tokenomy.engine.block_pool import BlockPool


def test_allocation_takes_least_recently_freed_first() -> None:
    pool = BlockPool(6)
    a = pool.allocate(3)
    b = pool.allocate(3)
    assert (a, b, pool.num_free) == ([0, 1, 2], [3, 4, 5], 0)
    pool.release(b)  # freed first, tail first
    pool.release(a)
    assert pool.free_order() == [5, 4, 3, 2, 1, 0]
    assert pool.allocate(2) == [5, 4]


def test_taking_back_a_cached_free_block_removes_it_from_the_queue() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.register(blocks, [11, 12, 13, 14])
    pool.release(blocks)
    pool.touch([3])  # a prefix hit on a free block
    assert pool.num_free == 3 and 3 not in pool.free_order()
    assert pool.allocate(3) == [2, 1, 0]
    assert pool.cached == {14: 3}  # the evicted blocks lost their keys, the hit one kept it
    pool.release([3])
    assert pool.free_order() == [3]


def test_stale_queue_entries_are_compacted_without_changing_lru_order() -> None:
    pool = BlockPool(4)
    for _ in range(3000):  # hit-and-release cycles leave one stale entry each
        pool.touch([1])
        pool.release([1])
    assert pool._tail - pool._head < 3000 and len(pool._queue) == 4 * 4 + 1024  # reclaimed, never grown
    assert pool.free_order() == [0, 2, 3, 1]
    assert pool.allocate(4) == [0, 2, 3, 1]


def test_small_allocations_behind_a_long_stale_stretch_take_the_lru_blocks() -> None:
    """A retained context taken back after its release leaves a long stretch of stale queue
    entries; allocations of a few blocks behind it still take the least recently freed blocks."""
    pool = BlockPool(2000)
    held = pool.allocate_ids(2000)
    pool.release(held[:1000])  # a finished context (queued 999, 998, ..., 0)
    pool.release(held[1000:])  # then another one (queued 1999, ..., 1000)
    pool.touch(held[50:1000])  # the first is retained again: 950 of its entries go stale
    expected = pool.free_order()
    assert expected[:50] == list(range(49, -1, -1)) and len(expected) == 1050
    got: list[int] = []
    while len(got) < len(expected):
        got += pool.allocate(min(3, len(expected) - len(got)))
    assert got == expected and pool.num_free == 0


def test_first_registered_block_keeps_a_key() -> None:
    pool = BlockPool(4)
    a, b = pool.allocate(1), pool.allocate(1)
    pool.register(a, [7])
    pool.register(b, [7])
    assert pool.cached == {7: a[0]} and pool.key_of(b[0]) is None


def _keys(content: tuple[tuple[int, int], ...], n: int, block_size: int = 4) -> list[int]:
    chain = KeyChain(content, block_size)
    chain.ensure(n)
    return chain.keys[:n]


def test_keys_do_not_depend_on_how_content_is_split_or_how_far_it_was_asked() -> None:
    whole = _keys(((1, 24),), 6)
    assert _keys(((1, 10), (1, 6), (1, 8)), 6) == whole
    chain = KeyChain(((1, 24),), 4)
    chain.ensure(2)
    chain.ensure(6)
    assert chain.keys == whole


@pytest.mark.parametrize(
    ("a", "b", "shared_blocks"),
    [
        (((1, 16),), ((1, 12), (2, 4)), 3),  # diverge in block 3
        (((1, 6), (2, 10)), ((1, 6), (2, 10)), 4),  # straddling blocks chain identically
        (((1, 6), (2, 10)), ((1, 6), (3, 10)), 1),
        (((9, 4), (1, 12)), ((9, 4), (1, 8), (2, 4)), 3),
        (((9, 4), (1, 12)), ((9, 4), (1, 4), (5, 8)), 2),
    ],
)
def test_keys_match_exactly_on_the_shared_token_prefix(
    a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...], shared_blocks: int
) -> None:
    ka, kb = _keys(a, 4), _keys(b, 4)
    assert ka[:shared_blocks] == kb[:shared_blocks]
    assert all(x != y for x, y in zip(ka[shared_blocks:], kb[shared_blocks:], strict=True))


class _ReferencePool:
    """The pool's contract, written the obvious way (an ordered dict as the LRU free list)."""

    def __init__(self, n: int) -> None:
        self.free: dict[int, None] = dict.fromkeys(range(n))  # insertion order = eviction order
        self.ref = [0] * n
        self.key: list[int | None] = [None] * n
        self.cached: dict[int, int] = {}

    def allocate(self, n: int) -> list[int]:
        blocks = list(self.free)[:n]
        for b in blocks:
            del self.free[b]
            if self.key[b] is not None:
                del self.cached[self.key[b]]
                self.key[b] = None
            self.ref[b] = 1
        return blocks

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            self.free.pop(b, None)
            self.ref[b] += 1

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def register(self, blocks: list[int], keys: list[int]) -> None:
        for b, k in zip(blocks, keys, strict=True):
            if k not in self.cached:
                self.cached[k] = b
                self.key[b] = k


@pytest.mark.parametrize("seed", range(6))
def test_pool_matches_the_reference_under_random_operations(seed: int) -> None:
    """Allocation order, evictions, hits and compaction agree with a plain LRU model, op by op."""
    rng = random.Random(seed)
    size = rng.choice([8, 40, 300])
    pool, ref = BlockPool(size), _ReferencePool(size)
    held: list[list[int]] = []  # each entry: distinct blocks holding one reference each
    next_key = 0
    for _ in range(3000):
        op = rng.random()
        if op < 0.35 and pool.num_free:
            n = rng.randint(1, min(pool.num_free, 24))
            got = pool.allocate(n)
            assert got == ref.allocate(n)
            if rng.random() < 0.7:  # fill and register some, sometimes under keys already cached
                keys = [rng.randrange(next_key + 1) if rng.random() < 0.1 else next_key + i for i in range(n)]
                keys = list(dict.fromkeys(keys))[: len(got)]
                next_key += n
                pool.register(got[: len(keys)], keys)
                ref.register(got[: len(keys)], keys)
            held.append(got)
        elif op < 0.6 and held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.release(blocks)
            ref.release(blocks)
        elif op < 0.85 and ref.cached:
            hits = rng.sample(sorted(ref.cached.values()), k=min(len(ref.cached), rng.randint(1, 6)))
            assert pool.num_evictable(hits) == sum(ref.ref[b] == 0 for b in hits)
            pool.touch(hits)
            ref.touch(hits)
            held.append(hits)
        assert pool.num_free == len(ref.free)
        assert pool.cached == ref.cached
    assert pool.free_order() == list(ref.free)
    assert [int(c) for c in pool.ref_cnt] == ref.ref
    assert all(pool.key_of(b) == ref.key[b] for b in range(size))


@pytest.mark.parametrize("seed", range(4))
def test_chain_registrations_match_the_reference_as_runs_grow_and_slots_are_collected(
    seed: int,
) -> None:
    """The pool caches chains by run (slots per run, moved when a longer chain extends a run, dead
    runs collected when the slot space fills): keys, blocks, lookups and evictions stay what
    per-key bookkeeping gives."""
    rng = random.Random(seed)
    bs = 4
    # Sessions whose stream grows turn by turn (a run outgrows its slots), sharing a system prompt.
    contents = [((0, rng.choice([6, 40])), (s, 4 * t + rng.randrange(4))) for s in range(1, 9) for t in (2, 9, 30)]
    chains = [KeyChain(c, bs) for c in contents]
    size = 48
    pool, ref = BlockPool(size), _ReferencePool(size)
    pool.slots = run_slots.RunSlots(pool.slots.key_slot, min_slots=8)  # collect and grow often
    held: list[list[int]] = []
    for step in range(1500):
        if rng.random() < 0.2:  # a new stream: new runs keep coming, old ones die out
            chains.append(KeyChain(((0, 6), (100 + step, rng.randrange(8, 120))), bs))
        chain = rng.choice(chains[-30:])
        if rng.random() < 0.45 and pool.num_free:
            n = min(rng.randint(1, chain.num_full_blocks), pool.num_free)
            got = pool.allocate(n)
            assert got == ref.allocate(n)
            chain.ensure(n)
            first = rng.randrange(n)  # register a middle stretch, as prefill chunks do
            pool.register_chain(got[first:], chain, first)
            ref.register(got[first:], chain.keys[first:n])
            held.append(got)
        elif held and rng.random() < 0.6:
            blocks = held.pop(rng.randrange(len(held)))
            pool.release(blocks)
            ref.release(blocks)
        limit = rng.randint(0, chain.num_full_blocks)
        chain.ensure(limit)
        hit = next((i for i, k in enumerate(chain.keys[:limit]) if k not in ref.cached), limit)
        assert pool.slots.cached_prefix(chain, limit) == hit
        assert pool.slots.cached_prefix(chain, limit, rng.randint(0, hit)) == hit  # (lookups resume from a known hit)
        assert pool.slots.chain_block_ids(chain, hit).tolist() == [ref.cached[k] for k in chain.keys[:hit]]
        assert pool.cached == ref.cached
    assert pool.slots.collections > 3 and pool.slots.runs_dropped > 0  # the space filled, dead runs were dropped
    assert all(pool.key_of(b) == ref.key[b] for b in range(size))


def test_an_admission_takes_its_hits_and_new_blocks_together_or_changes_nothing() -> None:
    """``take``: a free hit costs a free block like a new one; when both do not fit the pool is
    unchanged; when they do, the hits keep their keys and the new blocks evict the LRU front."""
    pool = BlockPool(8)
    held = pool.allocate(4)
    pool.register(held, [10, 11, 12, 13])
    pool.release(held)  # 4 cached free blocks (last block queued first), 4 never allocated
    hits = np.array(held[:2], dtype=np.int64)
    before = (pool.num_free, pool.free_order(), pool.cached, pool.ref_cnt.tolist())
    assert pool.take(hits, 7) is None  # 2 free hits + 7 new > 8 free
    assert (pool.num_free, pool.free_order(), pool.cached, pool.ref_cnt.tolist()) == before
    new = pool.take(hits, 6)
    assert new is not None and pool.num_free == 0
    assert new.tolist() == [4, 5, 6, 7, held[3], held[2]]  # the never-allocated, then the LRU front
    assert pool.cached == {10: held[0], 11: held[1]}  # 12 and 13 evicted, the hits kept theirs
    assert [int(pool.ref_cnt[b]) for b in range(8)] == [1] * 8


def test_a_prefix_scan_resumed_at_a_run_in_the_first_slots_counts_from_where_it_resumed() -> None:
    """A lookup resumes from a known hit (``start``): when the run it resumes in holds the slot
    space's first slots (registered before the runs ahead of it), the keys it finds count from
    ``start``, not from 0."""
    chain = KeyChain(((1, 8), (2, 8)), 4)  # two runs of two blocks
    chain.ensure(4)
    pool = BlockPool(8)
    blocks = pool.allocate(4)
    pool.register_chain(blocks[2:3], chain, 2)  # the second run first: slots 0 and 1, key 2 only
    pool.register_chain(blocks[0:2], chain, 0)
    assert pool.slots.cached_prefix(chain, 4) == 3
    assert pool.slots.cached_prefix(chain, 4, 2) == 3
    assert pool.slots.chain_block_ids(chain, 3).tolist() == blocks[:3]


def test_a_stream_growing_every_turn_moves_its_slots_a_logarithmic_number_of_times() -> None:
    """A session's stream is one run, a few keys longer every turn: it moves to new slots when it
    outgrows them, taking twice the room each time, so 60 turns move it a handful of times (not 60)."""
    pool = BlockPool(4096)
    slots = pool.slots
    starts = [slots.intern(7, 16 + 5 * turn) for turn in range(60)]
    moves = sum(a != b for a, b in zip(starts, starts[1:], strict=False))
    assert 1 <= moves <= 5
    assert slots.intern(7, 16) == starts[-1]  # a shorter chain of the same run stays where it is


def test_a_requests_block_ids_grow_in_order_and_copy_what_they_are_given() -> None:
    pool = BlockPool(64)
    given = pool.allocate_ids(5)
    ids = BlockIds(given)
    given[0] = 99  # the pool's vector is the caller's: the request kept its own copy
    for _ in range(20):  # past the first capacity
        ids.append(pool.allocate_one())
    ids.extend(pool.allocate_ids(3))
    assert list(ids) == list(range(28)) and len(ids) == 28
    assert (ids[0], ids[-1]) == (0, 27)
    with pytest.raises(IndexError):
        ids[28]
    pool.release(ids.ids())
    assert pool.num_free == 64 and pool.free_order()[-28:] == list(range(27, -1, -1))
