"""The remembered prefix lookup answers exactly what a fresh scan answers."""

from __future__ import annotations

import random

import pytest

from tokenomy.engine.block_keys import KeyChain
from tokenomy.engine.block_pool import BlockPool
from tokenomy.engine.prefix_lookup import PrefixLookup, common_prefix


def test_common_prefix_is_the_leading_keys_two_chains_share() -> None:
    """Run by run, it finds what comparing key by key finds: shared streams, a stream cut short, a
    block straddling two streams, nothing shared, and a limit inside the shared keys."""
    bs = 4
    a = KeyChain(((1, 40), (2, 40)), bs)  # two runs of 10 blocks
    others = [KeyChain(c, bs) for c in (((1, 40), (3, 40)), ((1, 20),), ((1, 42), (2, 38)), ((5, 40),),
                                         ((1, 40), (2, 40)), ((1, 40), (2, 20), (4, 20)))]
    a.ensure(a.num_full_blocks)
    found = []
    for b in others:
        b.ensure(b.num_full_blocks)
        for limit in range(min(a.num_full_blocks, b.num_full_blocks) + 1):
            expected = next((i for i in range(limit) if a.key(i) != b.key(i)), limit)
            assert common_prefix(a, b, limit) == expected == common_prefix(b, a, limit)
        found.append(common_prefix(a, b, min(a.num_full_blocks, b.num_full_blocks)))
    assert found == [10, 5, 10, 0, 20, 15]


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
