"""The pool of KV blocks: reference counts, the LRU free queue and the prefix-cache map.

Invariants:

* a block is free exactly when its reference count is 0; ``num_free`` counts them;
* a free block may still carry a key (it is *cached*): a later request with the same prefix
  takes it back (``touch``) instead of recomputing;
* allocation takes the least recently freed block first and drops its key then (eviction);
* ``cached[key] == block`` exactly when ``block_key[block] == key``.

The free queue is a FIFO of block ids with lazy deletion: freeing appends, taking a cached free
block back leaves its entry behind, and allocation skips entries that are no longer a free
block's newest one (entry ``i`` of the FIFO is valid iff ``last_seq[block] == i``; taking a
free block back sets its ``last_seq`` to -1). This gives vLLM's doubly-linked LRU list at deque speed. Blocks are plain ints
and per-block state lives in lists, so the hot paths run as bulk C-level operations: this code
runs for every prompt block, and bounds the simulator's speed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import count, repeat


def _drain(it: Iterator[object]) -> None:
    """Run an iterator of side effects at C speed."""
    deque(it, maxlen=0)


class BlockPool:
    """Reference-counted KV blocks with an LRU free queue and a key -> block map."""

    __slots__ = (
        "num_blocks",
        "num_free",
        "ref_cnt",
        "block_key",
        "cached",
        "_queue",
        "_last_seq",
        "_pushed",
        "_popped",
    )

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.ref_cnt: list[int] = [0] * num_blocks
        self.block_key: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        self._queue: deque[int] = deque(range(num_blocks))
        self._last_seq: list[int] = list(range(num_blocks))  # sequence number of each block's newest entry
        self._pushed = num_blocks  # entries ever appended
        self._popped = 0  # entries ever popped

    def free_order(self) -> list[int]:
        """Free blocks, next to be evicted first (for tests and debugging)."""
        last_seq = self._last_seq
        return [b for b, seq in zip(self._queue, count(self._popped)) if last_seq[b] == seq]

    def allocate_one(self) -> int:
        """Take one block off the LRU front (the caller checked ``num_free >= 1``): the decode path."""
        popleft, last_seq, ref = self._queue.popleft, self._last_seq, self.ref_cnt
        while True:
            block = popleft()
            seq = self._popped
            self._popped = seq + 1
            if last_seq[block] == seq:
                break
        key = self.block_key[block]
        if key is not None:
            del self.cached[key]
            self.block_key[block] = None
        ref[block] = 1
        self.num_free -= 1
        return block

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks off the LRU front (the caller checked ``num_free >= n``)."""
        popleft, last_seq, ref, key_of = self._queue.popleft, self._last_seq, self.ref_cnt, self.block_key
        blocks: list[int] = []
        while len(blocks) < n:
            want = n - len(blocks)
            batch = [popleft() for _ in range(want)]
            seqs = range(self._popped, self._popped + want)
            self._popped += want
            if list(map(last_seq.__getitem__, batch)) == list(seqs):
                blocks += batch
            else:
                blocks += [b for b, seq in zip(batch, seqs, strict=True) if last_seq[b] == seq]
        keys = list(map(key_of.__getitem__, blocks))
        if keys.count(None) != n:
            # Evict: these blocks' contents are about to be overwritten.
            _drain(map(self.cached.__delitem__, [k for k in keys if k is not None]))
            _drain(map(key_of.__setitem__, blocks, repeat(None)))
        _drain(map(ref.__setitem__, blocks, repeat(1)))
        self.num_free -= n
        return blocks

    def touch(self, blocks: list[int]) -> None:
        """Take a reference on cached blocks (prefix hits, retention); free ones stop being free."""
        ref, last_seq = self.ref_cnt, self._last_seq
        for block in blocks:
            if ref[block] == 0:
                self.num_free -= 1
                last_seq[block] = -1  # its queue entry becomes stale
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
        freed = (
            rev if counts.count(0) == len(rev) else [b for b, c in zip(rev, counts, strict=True) if c == 0]
        )
        self._queue.extend(freed)
        _drain(map(self._last_seq.__setitem__, freed, range(self._pushed, self._pushed + len(freed))))
        self._pushed += len(freed)
        self.num_free += len(freed)
        if len(self._queue) > 2 * self.num_blocks + 1024:
            self._compact()

    def _compact(self) -> None:
        """Drop stale entries (they pile up when cached free blocks are taken back often)."""
        valid = self.free_order()
        self._queue = deque(valid)
        self._popped = 0
        self._pushed = len(valid)
        _drain(map(self._last_seq.__setitem__, valid, range(len(valid))))

    def register(self, blocks: list[int], keys: list[int]) -> None:
        """Make just-filled blocks findable under their keys.

        When a key is already cached (two requests computed the same prefix at once), the block
        registered first keeps it and the newcomer stays unkeyed.
        """
        cached, key_of = self.cached, self.block_key
        if len(keys) == 1:
            if keys[0] not in cached:
                cached[keys[0]] = blocks[0]
                key_of[blocks[0]] = keys[0]
            return
        if list(map(cached.get, keys)).count(None) == len(keys):
            cached.update(zip(keys, blocks, strict=True))
            _drain(map(key_of.__setitem__, blocks, keys))
            return
        for block, key in zip(blocks, keys, strict=True):
            if key not in cached:
                cached[key] = block
                key_of[block] = key

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of these cached blocks are free (taking them costs free blocks)."""
        ref = self.ref_cnt
        return [ref[block] for block in blocks].count(0)
