"""The remembered prefix lookup answers exactly what a fresh scan answers."""

from __future__ import annotations

import random

import pytest

from tokenomy.engine.block_keys import KeyChain
from tokenomy.engine.block_pool import BlockPool
from tokenomy.engine.prefix_lookup import PrefixLookup, common_prefix


def test_common_prefix_of_chained_keys() -> None:
    a = [1, 2, 3, 4, 5].__getitem__
    assert common_prefix(a, [1, 2, 3, 9, 9].__getitem__, 5) == 3
    assert common_prefix(a, [1, 2, 3, 4, 5].__getitem__, 5) == 5
    assert common_prefix(a, [7, 2, 3, 4, 5].__getitem__, 5) == 0
    assert common_prefix(a, [1, 9, 9, 9, 9].__getitem__, 4) == 1
    assert common_prefix(a, [1, 2, 3, 4, 9].__getitem__, 4) == 4
    assert common_prefix(a, a, 0) == 0


@pytest.mark.parametrize("seed", range(6))
def test_lookups_match_fresh_scans_under_registrations_and_evictions(seed: int) -> None:
    rng = random.Random(seed)
    bs = 4
    # Contents sharing prefixes: a common "system prompt" stream, then per-session streams.
    contents = [((0, 40), (s, rng.randrange(4, 60))) for s in range(1, 7)]
    contents += [((0, 40), (s, 80)) for s in range(1, 4)]
    chains = [KeyChain(c, bs) for c in contents]
    pool = BlockPool(64)
    lookup = PrefixLookup(pool)
    held: list[list[int]] = []
    for _ in range(400):
        op = rng.random()
        chain = rng.choice(chains)
        if op < 0.4:  # register a prefix of a chain on fresh blocks (allocation may evict)
            n = min(rng.randrange(1, 30), chain.num_full_blocks, pool.num_free)
            if n:
                chain.ensure(n)
                blocks = pool.allocate(n)
                pool.register_chain(blocks, chain, 0)
                held.append(blocks)
        elif op < 0.6 and held:
            pool.release(held.pop(rng.randrange(len(held))))
        max_blocks = rng.randrange(0, chain.num_full_blocks + 1)
        chain.ensure(max_blocks)
        cached = pool.cached  # every key and its block, as ints: the scan written the obvious way
        fresh = next((i for i, key in enumerate(chain.keys[:max_blocks]) if key not in cached), max_blocks)
        assert lookup.run(chain, max_blocks) == pool.slots.cached_prefix(chain, max_blocks) == fresh
