"""The pool of KV blocks: reference counts, the LRU free queue and the prefix cache.

Invariants:

* a block is free exactly when its reference count is 0; ``num_free`` counts them;
* a free block may still carry a key (it is *cached*): a later request with the same prefix
  takes it back (``touch``) instead of recomputing;
* allocation takes the least recently freed block first and drops its key then (eviction);
* a key is held by at most one block, and a block holds at most one key.

The free queue is a FIFO of block ids with lazy deletion, as in vLLM's free-block queue but
flat: freeing appends at the tail, taking a cached free block back leaves its entry behind, and
allocation skips entries that are no longer a free block's newest one (the entry at position
``p`` is valid iff ``last_pos[block] == p``; taking a free block back sets ``last_pos`` to -1).
When the buffer fills up, the valid entries are moved to its front (``_compact``). Blocks never
allocated yet are the queue's front in id order (vLLM starts with every block free, in order):
they are kept as a counter (``_fresh``), not as entries, so creating a pool of millions of blocks
writes no queue entry.

The prefix cache is indexed by key run, not by key (:mod:`tokenomy.engine.run_slots`): each
block holds the slot of its key (``_key_slot``), so an allocation evicts its blocks' keys with one
vector write. Keys as ints (``key = base + offset``) remain the pool's public view (:meth:`key_of`,
:attr:`cached`), for tests and debugging.

Per-block state lives in numpy arrays and a call's blocks are handled as one vector: a prompt
is hundreds of blocks (a Mooncake prompt averages ~750 blocks of 16 tokens), and these calls run
for each of them, so this module bounds the simulator's speed. Callers pass block ids as an int64
vector (:mod:`tokenomy.engine.block_ids`; a list is converted) and get one from
:meth:`BlockPool.allocate_ids` (:meth:`BlockPool.allocate` gives a list); the blocks of one call are
distinct (a request never holds a block twice). The single-block paths (decode growth, one filled
block) skip numpy: they read and write the same arrays through memoryviews.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import numpy.typing as npt

from tokenomy.engine.block_ids import NO_BLOCKS, BlockVector, as_vector
from tokenomy.engine.block_keys import KeyChain
from tokenomy.engine.run_slots import RunSlots


class BlockPool:
    """Reference-counted KV blocks with an LRU free queue and a prefix cache indexed by key run."""

    __slots__ = (
        "num_blocks",
        "num_free",
        "num_evicted",
        "version",
        "ref_cnt",
        "_key_slot",
        "_queue",
        "_head",
        "_tail",
        "_last_pos",
        "_fresh",
        "slots",
        "_ref_v",
        "_key_slot_v",
        "_queue_v",
        "_last_pos_v",
    )

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.num_evicted = 0  # cached blocks whose key allocation dropped, ever (read by traces)
        self.version = 0  # changes whenever the cache gains or loses a key (lookups memoise on it)
        self.ref_cnt: BlockVector = np.zeros(num_blocks, dtype=np.int64)
        self._key_slot: BlockVector = np.full(num_blocks, -1, dtype=np.int64)  # the slot of its key, -1: none
        capacity = 4 * num_blocks + 1024  # compaction runs after about 3 * num_blocks frees
        self._queue: BlockVector = np.zeros(capacity, dtype=np.int64)  # (zeros: no page is touched until used)
        self._head = 0  # entries before it were consumed
        self._tail = 0  # next free slot
        # Position of each block's newest entry (meaningful only for blocks that have an entry:
        # every entry is written together with it).
        self._last_pos: BlockVector = np.zeros(num_blocks, dtype=np.int64)
        self._fresh = 0  # blocks _fresh.. were never allocated: they come first, in id order
        self.slots = RunSlots(self._key_slot)  # the prefix cache's index (lookups go to it directly)
        # The same arrays as memoryviews, for the single-block paths: an element read or written
        # through one costs a third of numpy's scalar indexing.
        self._ref_v = self.ref_cnt.data
        self._key_slot_v = self._key_slot.data
        self._queue_v = self._queue.data
        self._last_pos_v = self._last_pos.data

    # ---- inspection ---------------------------------------------------------------------------
    def key_of(self, block: int) -> int | None:
        """The key ``block`` is cached under, or None (a scan of the runs: for tests and debugging)."""
        slot = int(self._key_slot[block])
        return None if slot < 0 else self.slots.key_at(slot)

    @property
    def cached(self) -> dict[int, int]:
        """Every cached key and its block, as a new dict (for tests and debugging)."""
        return self.slots.cached()

    def free_order(self) -> list[int]:
        """Free blocks, next to be evicted first (for tests and debugging)."""
        return list(range(self._fresh, self.num_blocks)) + self._valid_entries().tolist()

    def _valid_entries(self) -> BlockVector:
        """The queue's live entries (freed blocks, LRU first), skipping consumed and stale ones."""
        head, tail = self._head, self._tail
        entries = self._queue[head:tail]
        return entries[self._last_pos[entries] == np.arange(head, tail)]

    def num_evictable(self, blocks: list[int] | BlockVector) -> int:
        """How many of these cached blocks are free (taking them costs free blocks)."""
        if len(blocks) == 0:
            return 0
        return int(np.count_nonzero(self.ref_cnt[blocks] == 0))

    # ---- allocation ---------------------------------------------------------------------------
    def allocate_one(self) -> int:
        """Take one block off the LRU front (the caller checked ``num_free >= 1``): the decode path."""
        ref = self._ref_v
        if self._fresh < self.num_blocks:
            fresh = self._fresh
            self._fresh = fresh + 1
            ref[fresh] = 1
            self.num_free -= 1
            return fresh
        # Ids as the objects read (Any): compiled, an int is unboxed and boxed anew, an allocation,
        # for each array it indexes; the block indexes three of them, its slot two.
        queue: Any = self._queue_v
        last_pos: Any = self._last_pos_v
        head = self._head
        block: Any = queue[head]
        while last_pos[block] != head:
            head += 1
            block = queue[head]
        self._head = head + 1
        key_slot: Any = self._key_slot_v
        slot: Any = key_slot[block]
        if slot >= 0:
            self.slots.slot_view[slot] = -1
            key_slot[block] = -1
            self.num_evicted += 1
            self.version += 1
        ref[block] = 1
        self.num_free -= 1
        return cast(int, block)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks off the LRU front (the caller checked ``num_free >= n``)."""
        if n == 1:
            return [self.allocate_one()]
        ids: list[int] = self.allocate_ids(n).tolist()
        return ids

    def allocate_ids(self, n: int, *, view: bool = False) -> BlockVector:
        """:meth:`allocate` as a vector: a new one the caller may keep, or with ``view`` possibly a
        view of the queue, valid until the next call that changes the pool (for a caller that
        copies it at once)."""
        if n <= 0:
            return NO_BLOCKS
        queue, last_pos = self._queue, self._last_pos
        head = self._head
        parts: list[BlockVector] = []
        want = n
        fresh = self._fresh
        if fresh < self.num_blocks:
            take = min(want, self.num_blocks - fresh)
            parts.append(np.arange(fresh, fresh + take, dtype=np.int64))
            self._fresh = fresh + take
            want -= take
        look = want
        while want:
            # Stale entries (blocks a prefix hit took back) can lie in long stretches: each pass
            # looks twice as far as the last, so a stretch costs O(log) passes, not O(stretch / n).
            end = min(head + look, self._tail)
            batch = queue[head:end]
            valid = last_pos[batch] == np.arange(head, end)
            if np.count_nonzero(valid) == len(valid):  # (not .all(): numpy's method costs 4x as much)
                parts.append(batch[:want])
                head += want
                break
            at = valid.nonzero()[0]
            if len(at) >= want:
                parts.append(batch[at[:want]])
                head += int(at[want - 1]) + 1
                break
            parts.append(batch[at])
            want -= len(at)
            head = end
            look *= 2
        self._head = head
        blocks = parts[0] if len(parts) == 1 else np.concatenate(parts)
        slots = self._key_slot[blocks]
        keyed = slots >= 0
        n_keyed = int(np.count_nonzero(keyed))
        if n_keyed:
            # Evict: these blocks' contents are about to be overwritten. (All keyed, the common
            # case once the cache is full: no mask to apply.)
            if n_keyed < n:
                slots, evicted = slots[keyed], blocks[keyed]
            else:
                evicted = blocks
            self.slots.slot_block[slots] = -1
            self._key_slot[evicted] = -1
            self.num_evicted += n_keyed
            self.version += 1
        self.ref_cnt[blocks] = 1
        self.num_free -= n
        return blocks if view or blocks.base is None else blocks.copy()  # (not a view of the queue)

    def take(self, hits: BlockVector, n: int) -> BlockVector | None:
        """Admission in one call: reference the cached blocks ``hits`` and allocate ``n`` new ones
        (a view, as :meth:`allocate_ids` with ``view``), or None, changing nothing, when the free
        pool cannot cover both (a hit that is free takes a free block; ``n <= 0``: none new).

        :meth:`num_evictable` then :meth:`touch` would read the hits' reference counts twice."""
        if len(hits):
            counts, was_free, n_free = self._refs(hits)
            if n + n_free > self.num_free:
                return None
            self._touch(hits, counts, was_free, n_free)  # before allocating, so allocation cannot evict them
        elif n > self.num_free:
            return None
        return self.allocate_ids(n, view=True)

    def touch(self, blocks: list[int] | BlockVector) -> None:
        """Take a reference on cached blocks (prefix hits, retention); free ones stop being free.

        An int64 vector is used as is, without a conversion.
        """
        if len(blocks) == 0:
            return
        ids = as_vector(blocks)
        counts, was_free, n_free = self._refs(ids)
        self._touch(ids, counts, was_free, n_free)

    def _refs(self, ids: BlockVector) -> tuple[BlockVector, npt.NDArray[np.bool_], int]:
        """The blocks' reference counts, which of them are 0 (free), and how many."""
        counts = self.ref_cnt[ids]
        was_free = counts == 0
        return counts, was_free, int(np.count_nonzero(was_free))

    def _touch(self, ids: BlockVector, counts: BlockVector, was_free: npt.NDArray[np.bool_], n_free: int) -> None:
        """:meth:`touch` with the blocks' reference counts read (``counts``), those at 0 and how many."""
        ref = self.ref_cnt
        if n_free:
            freed = ids if n_free == len(ids) else ids[was_free]  # (all free: no mask to apply)
            if self._fresh < self.num_blocks and freed.item(int(freed.argmax())) >= self._fresh:  # (not .max(): Python)
                self._absorb_fresh()  # a never-allocated block leaves the queue's middle: give it an entry
            self._last_pos[freed] = -1  # their queue entries become stale
            self.num_free -= n_free
        ref[ids] = counts + 1

    def release(self, blocks: list[int] | BlockVector) -> None:
        """Drop one reference on each block, in reverse order.

        Reverse order puts a request's tail blocks in the queue first, so they are evicted before
        its head blocks: the head is the prefix other requests are most likely to share.
        """
        if len(blocks) == 0:
            return
        ids = as_vector(blocks)
        ref = self.ref_cnt
        counts = ref[ids]
        counts -= 1
        ref[ids] = counts
        # All freed (no other request holds one), the common case: no mask to apply.
        freed = ids if not np.count_nonzero(counts) else ids[counts == 0]
        n = len(freed)
        if not n:
            return
        if self._tail + n > len(self._queue):
            self._compact()
        tail = self._tail
        # Queued last block first, without a reversed copy: the ids in their order (contiguous,
        # which scatters need to be fast) take their positions counted down.
        self._queue[tail : tail + n] = freed[::-1]
        self._last_pos[freed] = np.arange(tail + n - 1, tail - 1, -1)
        self._tail = tail + n
        self.num_free += n

    def _absorb_fresh(self) -> None:
        """Write the never-allocated blocks into the queue as entries, ahead of the freed ones."""
        entries = np.concatenate([np.arange(self._fresh, self.num_blocks, dtype=np.int64), self._valid_entries()])
        n = len(entries)
        self._queue[:n] = entries
        self._last_pos[entries] = np.arange(n)
        self._head, self._tail = 0, n
        self._fresh = self.num_blocks

    def _compact(self) -> None:
        """Move the valid queue entries to the front (consumed and stale entries pile up behind)."""
        valid = self._valid_entries()  # a copy: safe to write back over the buffer's front
        n = len(valid)
        self._queue[:n] = valid
        self._last_pos[valid] = np.arange(n)
        self._head, self._tail = 0, n

    # ---- prefix cache: registration (lookups: :attr:`slots`) --------------------------------------
    def register_one(self, block: int, base: int, offset: int = 0, run_count: int = 1) -> None:
        """Make a just-filled block findable under key ``base + offset`` of its run (``run_count``
        keys long; a single key: ``base``). A key cached already keeps its block."""
        slots = self.slots
        slot: Any = slots.intern(base, max(run_count, offset + 1)) + offset  # (boxed once: allocate_one)
        view = slots.slot_view  # (after intern: a collection replaces the slot space)
        if view[slot] < 0:
            held: Any = block
            view[slot] = held
            self._key_slot_v[held] = slot
            self.version += 1

    def register(self, blocks: list[int], keys: list[int]) -> None:
        """:meth:`register_one` of each block under a single key (no run): for tests and callers
        without a chain."""
        for block, key in zip(blocks, keys, strict=True):
            self.register_one(block, key)

    def register_chain(self, blocks: list[int] | BlockVector, chain: KeyChain, index: int) -> None:
        """Make just-filled blocks findable as the chain's keys ``index, index + 1, ...`` (computed).

        When a key is already cached (two requests computed the same prefix at once), the block
        registered first keeps it and the newcomer stays unkeyed.
        """
        if len(blocks) == 1:
            base, offset, count = chain.ref(index)
            self.register_one(int(blocks[0]), base, offset, count)
            return
        starts, takes = self.slots.chain_spans(chain, index, len(blocks))
        ids = as_vector(blocks)
        sb = self.slots.slot_block
        key_slot = self._key_slot
        keyed = False
        j = 0
        for start, take in zip(starts, takes, strict=True):
            end = start + take
            if take == 1:
                block = ids.item(j)
                held = self.slots.slot_view[start]
                if held < 0 or held == block:
                    self.slots.slot_view[start] = block
                    self._key_slot_v[block] = start
                    keyed = True
            else:
                piece = ids[j : j + take]
                held_v = sb[start:end]
                top = int(held_v.argmax())  # (no key held in the span, the common case: slices only)
                if held_v.item(top) < 0:
                    sb[start:end] = piece
                    key_slot[piece] = np.arange(start, end, dtype=np.int64)
                    keyed = True
                else:
                    at = ((held_v < 0) | (held_v == piece)).nonzero()[0]
                    if len(at):
                        fresh = piece[at]
                        sb[at + start] = fresh
                        key_slot[fresh] = at + start
                        keyed = True
            j += take
        if keyed:
            self.version += 1
