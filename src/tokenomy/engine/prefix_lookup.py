"""How many leading blocks of a key chain the pool holds: the prefix lookup, remembered.

Routers and placement ask every instance about every request, often several times per
decision, and agent sessions share long prefixes (a system prompt, a repository, the session's
own history). A :class:`PrefixLookup` answers from what it found before wherever that still
holds, with exactly the answer a fresh scan gives:

* no key left the pool since a scan (its eviction count is unchanged): every key found then is
  still cached, so a later scan starts where the earlier one stopped;
* nothing changed at all (its version is unchanged): a key missing then is still missing;
* a key the latest chain scanned found cached is cached for any chain that has it (with no
  eviction since), so a new chain starts from the leading keys it shares with that chain (a
  system prompt, the session's history), found run by run (:func:`common_prefix`).
"""

from __future__ import annotations

from typing import Final

from tokenomy.engine.block_keys import KeyChain
from tokenomy.engine.block_pool import BlockPool

_MEMO_MAX: Final = 64  # chains remembered (requests in flight on one instance)


def common_prefix(a: KeyChain, b: KeyChain, limit: int) -> int:
    """The largest ``m <= limit`` with ``a.key(i) == b.key(i)`` for every ``i < m`` (both chains have
    computed ``limit`` keys). Walks both chains' runs together: keys within a run are consecutive,
    so two runs whose keys agree at a block agree up to the end of the shorter one, and each run
    is compared once."""
    firsts_a, bases_a, counts_a = a.run_first, a.run_base, a.run_count
    firsts_b, bases_b, counts_b = b.run_first, b.run_base, b.run_count
    ra = rb = 0
    i = 0
    while i < limit:
        first_a, first_b = firsts_a[ra], firsts_b[rb]
        if bases_a[ra] + i - first_a != bases_b[rb] + i - first_b:
            return i
        end_a, end_b = first_a + counts_a[ra], first_b + counts_b[rb]
        i = min(end_a, end_b, limit)
        if i == end_a:
            ra += 1
        if i == end_b:
            rb += 1
    return limit


class PrefixLookup:
    """Cached-prefix lengths of key chains in one pool, remembered (see the module docstring)."""

    __slots__ = ("pool", "_memo", "_latest")

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        # id(chain) -> (chain, pool version, evictions, blocks scanned, blocks hit)
        self._memo: dict[int, tuple[KeyChain, int, int, int, int]] = {}
        self._latest: tuple[KeyChain | None, int, int] = (None, -1, 0)  # (chain, evictions, blocks hit)

    def run(self, chain: KeyChain, max_blocks: int) -> int:
        """``RunSlots.cached_prefix`` of the chain's first ``max_blocks`` keys (``max_blocks <= num_full_blocks``)."""
        pool = self.pool
        version, evicted = pool.version, pool.num_evicted
        memo = self._memo
        last = memo.get(id(chain))
        start = 0
        if last is not None and last[0] is chain and last[2] == evicted:
            _, last_version, _, scanned, hit = last
            if hit < scanned and last_version == version:  # stopped at a key still missing
                return min(hit, max_blocks)
            if max_blocks <= hit:
                return max_blocks
            start = hit
        chain.ensure(max_blocks)
        other, other_evicted, other_hit = self._latest
        if other is not None and other is not chain and other_evicted == evicted and other_hit > start:
            start = max(start, common_prefix(chain, other, min(max_blocks, other_hit)))
        hit = pool.slots.cached_prefix(chain, max_blocks, start)
        if len(memo) >= _MEMO_MAX and id(chain) not in memo:
            memo.clear()
        memo[id(chain)] = (chain, version, evicted, max_blocks, hit)
        self._latest = (chain, evicted, hit)
        return hit
