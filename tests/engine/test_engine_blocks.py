"""Block pool (LRU free queue with lazy deletion) and block keys, in isolation."""

from __future__ import annotations

import pytest

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
    assert pool._tail - pool._head <= 2 * 4 + 1024
    assert pool.free_order() == [0, 2, 3, 1]
    assert pool.allocate(4) == [0, 2, 3, 1]


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
