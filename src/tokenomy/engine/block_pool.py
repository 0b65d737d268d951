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
free block back sets its ``last_seq`` to -1). This gives vLLM's doubly-linked LRU list at list
speed: the FIFO is a list read from a head index, so taking ``n`` blocks is one slice, and the
consumed prefix is dropped now and then. Blocks are plain ints
and per-block state lives in lists, so the hot paths are slices, comprehensions and tight loops
(list stores specialise in the interpreter, ~3x faster than ``map(list.__setitem__, ...)``): this
code runs for every prompt block, and bounds the simulator's speed.
"""

from __future__ import annotations


class BlockPool:
    """Reference-counted KV blocks with an LRU free queue and a key -> block map."""

    __slots__ = (
        "num_blocks",
        "num_free",
        "ref_cnt",
        "block_key",
        "cached",
        "_queue",
        "_head",
        "_base",
        "_last_seq",
    )

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.ref_cnt: list[int] = [0] * num_blocks
        self.block_key: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        self._queue: list[int] = list(range(num_blocks))  # entries before ``_head`` were popped
        self._head = 0
        self._base = 0  # sequence number of ``_queue[0]``: entry ``p`` has sequence ``_base + p``
        self._last_seq: list[int] = list(range(num_blocks))  # sequence number of each block's newest entry

    def free_order(self) -> list[int]:
        """Free blocks, next to be evicted first (for tests and debugging)."""
        last_seq, head = self._last_seq, self._head
        return [b for seq, b in enumerate(self._queue[head:], self._base + head) if last_seq[b] == seq]

    def allocate_one(self) -> int:
        """Take one block off the LRU front (the caller checked ``num_free >= 1``): the decode path."""
        queue, last_seq, ref = self._queue, self._last_seq, self.ref_cnt
        head, base = self._head, self._base
        block = queue[head]
        while last_seq[block] != base + head:
            head += 1
            block = queue[head]
        self._head = head + 1
        key = self.block_key[block]
        if key is not None:
            del self.cached[key]
            self.block_key[block] = None
        ref[block] = 1
        self.num_free -= 1
        return block

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks off the LRU front (the caller checked ``num_free >= n``)."""
        queue, last_seq, ref, key_of = self._queue, self._last_seq, self.ref_cnt, self.block_key
        head, base = self._head, self._base
        blocks: list[int] = []
        while len(blocks) < n:
            want = n - len(blocks)
            batch = queue[head : head + want]
            seqs = range(base + head, base + head + want)
            head += want
            if [last_seq[b] for b in batch] == list(seqs):
                blocks += batch
            else:
                blocks += [b for b, seq in zip(batch, seqs, strict=True) if last_seq[b] == seq]
        self._head = head
        keys = [key_of[b] for b in blocks]
        if keys.count(None) != n:
            # Evict: these blocks' contents are about to be overwritten.
            cached = self.cached
            for b, k in zip(blocks, keys, strict=True):
                if k is not None:
                    del cached[k]
                    key_of[b] = None
        # Plain loops: list stores specialise in the interpreter and beat map(list.__setitem__).
        for b in blocks:
            ref[b] = 1
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
        for b, c in zip(rev, counts, strict=True):
            ref[b] = c
        freed = (
            rev if counts.count(0) == len(rev) else [b for b, c in zip(rev, counts, strict=True) if c == 0]
        )
        queue = self._queue
        pushed = self._base + len(queue)
        queue += freed
        last_seq = self._last_seq
        for b, seq in zip(freed, range(pushed, pushed + len(freed)), strict=True):
            last_seq[b] = seq
        self.num_free += len(freed)
        if len(queue) - self._head > 2 * self.num_blocks + 1024:
            self._compact()
        elif self._head > self.num_blocks + 1024:
            del queue[: self._head]  # drop the consumed prefix; sequence numbers stay
            self._base += self._head
            self._head = 0

    def _compact(self) -> None:
        """Drop stale entries (they pile up when cached free blocks are taken back often)."""
        valid = self.free_order()
        self._queue = valid
        self._head = 0
        self._base = 0
        last_seq = self._last_seq
        for seq, b in enumerate(valid):
            last_seq[b] = seq

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
            for b, k in zip(blocks, keys, strict=True):
                key_of[b] = k
            return
        for block, key in zip(blocks, keys, strict=True):
            if key not in cached:
                cached[key] = block
                key_of[block] = key

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of these cached blocks are free (taking them costs free blocks)."""
        ref = self.ref_cnt
        return [ref[block] for block in blocks].count(0)
