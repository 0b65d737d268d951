"""The pool of KV blocks: reference counts, the LRU free queue and the prefix-cache map.

Invariants:

* a block is in the free queue exactly when its reference count is 0;
* a free block may still carry a key (it is *cached*): a later request with the same prefix
  takes it back (``touch``) instead of recomputing;
* allocation takes the least recently freed block first and drops its key then (eviction);
* ``cached[key] == block`` only for the one block registered under that key.

Blocks are plain ints ``0 .. num_blocks - 1``; per-block state lives in two lists so that the hot
paths do no per-block object creation.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from itertools import repeat


def _drain(it: Iterator[object]) -> None:
    """Run an iterator of side effects at C speed."""
    deque(it, maxlen=0)


class BlockPool:
    """Reference-counted KV blocks with an LRU free queue and a key -> block map."""

    __slots__ = ("num_blocks", "ref_cnt", "block_key", "cached", "_free")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_cnt: list[int] = [0] * num_blocks
        self.block_key: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        # OrderedDict as an O(1) doubly linked LRU list: front = least recently freed.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks no request holds (cached-but-free blocks included)."""
        return len(self._free)

    def free_order(self) -> list[int]:
        """Free blocks, next to be evicted first (for tests and debugging)."""
        return list(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks off the LRU front (the caller checked ``num_free >= n``).

        Bulk operations (``map`` over bound C methods) instead of a per-block Python loop: this
        runs for every prompt block, so it bounds the simulator's speed.
        """
        popitem, key_of, ref = self._free.popitem, self.block_key, self.ref_cnt
        blocks = [popitem(False)[0] for _ in range(n)]
        keys = list(map(key_of.__getitem__, blocks))
        if keys.count(None) != n:
            # Evict: these blocks' contents are about to be overwritten.
            _drain(map(self.cached.__delitem__, [k for k in keys if k is not None]))
            _drain(map(key_of.__setitem__, blocks, repeat(None)))
        _drain(map(ref.__setitem__, blocks, repeat(1)))
        return blocks

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on cached blocks (prefix hits, retention), pulling free ones off the queue."""
        free, ref = self._free, self.ref_cnt
        for block in blocks:
            if ref[block] == 0:
                del free[block]
            ref[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one reference on each block, in reverse order.

        Reverse order puts a request's tail blocks in the queue first, so they are evicted before
        its head blocks: the head is the prefix other requests are most likely to share.
        """
        ref = self.ref_cnt
        rev = blocks[::-1]
        counts = [ref[b] - 1 for b in rev]
        _drain(map(ref.__setitem__, rev, counts))
        if counts.count(0) == len(rev):
            self._free.update(dict.fromkeys(rev))
        else:
            self._free.update(dict.fromkeys([b for b, c in zip(rev, counts, strict=True) if c == 0]))

    def register(self, blocks: list[int], keys: list[int]) -> None:
        """Make just-filled blocks findable under their keys.

        When a key is already cached (two requests computed the same prefix at once), the block
        registered first keeps it and the newcomer stays unkeyed, so that ``cached[key] == block``
        exactly when ``block_key[block] == key``.
        """
        cached, key_of = self.cached, self.block_key
        if list(map(cached.get, keys)).count(None) == len(keys):
            cached.update(zip(keys, blocks, strict=True))
            _drain(map(key_of.__setitem__, blocks, keys))
            return
        for block, key in zip(blocks, keys, strict=True):
            if key not in cached:
                cached[key] = block
                key_of[block] = key

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of these cached blocks sit in the free queue (taking them costs free blocks)."""
        ref = self.ref_cnt
        return [ref[block] for block in blocks].count(0)
