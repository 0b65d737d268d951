"""How many leading blocks of a key chain the pool holds: the prefix lookup, remembered.

Routers and placement ask every instance about every request, often several times per
decision, and agent sessions share long prefixes (a system prompt, a repository, the session's
own history). A :class:`PrefixLookup` answers from what it found before wherever that still
holds, with exactly the answer a fresh scan gives:

* no key left the pool since a scan (its eviction count is unchanged): every key found then is
  still cached, so a later scan starts where the earlier one stopped;
* nothing changed at all (its version is unchanged): a key missing then is still missing;
* two chains whose keys agree at block ``i`` agree on every block before it (a block's key is a
  function of its whole token prefix, ``engine/block_keys.py``), so a new chain starts from
  the common prefix with the latest chain scanned, found by bisection on key equality.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenomy.engine.block_keys import KeyChain
from tokenomy.engine.block_pool import BlockPool

_MEMO_MAX = 64  # chains remembered (requests in flight on one instance)


def common_prefix(a: Callable[[int], int], b: Callable[[int], int], limit: int) -> int:
    """The largest ``m <= limit`` with ``a(i) == b(i)`` for every ``i < m``, for keys of chained keys
    (equal at ``i`` implies equal before ``i``) given by index; both must have ``limit`` keys."""
    if limit <= 0 or a(0) != b(0):
        return 0
    if a(limit - 1) == b(limit - 1):
        return limit
    lo, hi = 1, limit - 1  # a(lo - 1) == b(lo - 1), a(hi) != b(hi)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a(mid - 1) == b(mid - 1):
            lo = mid
        else:
            hi = mid - 1
    return lo


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
            start = max(start, common_prefix(chain.key, other.key, min(max_blocks, other_hit)))
        hit = pool.slots.cached_prefix(chain, max_blocks, start)
        if len(memo) >= _MEMO_MAX and id(chain) not in memo:
            memo.clear()
        memo[id(chain)] = (chain, version, evicted, max_blocks, hit)
        self._latest = (chain, evicted, hit)
        return hit
