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
they are kept as a counter (``_fresh``), not as entries, so a pool of millions of blocks costs
nothing to create.

The prefix cache is indexed by *run*, not by key. A key chain (``engine/block_keys.py``) keys a
run of blocks ``base + 0, base + 1, ...``; the pool gives each run it caches a range of *slots*
(``_runs[base] = (first slot, capacity)``) and ``_slot_block[slot]`` is the block caching that key
(-1: none). A single key (a block straddling pieces, a request's own block) is a run of one,
its key its base. So a prompt's hundreds of blocks are looked up, registered and evicted as a
few vector operations on slots, without a dictionary operation per block; a run whose blocks
were all evicted keeps its slots until the slot space fills, when live runs are moved to its
front (``_collect``). Keys as ints (``key = base + offset``) remain the pool's public view
(:meth:`key_of`, :attr:`cached`), for tests and debugging.

Per-block state lives in numpy arrays and a call's blocks are handled as one vector: a prompt
is hundreds of blocks (a Mooncake prompt averages ~750 blocks of 16 tokens), and these calls run
for each of them, so this module bounds the simulator's speed. Callers pass and get plain
``list[int]`` block ids; the blocks of one call are distinct (a request never holds a block
twice). The single-block paths (decode growth, one filled block) skip numpy's vector overhead.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from tokenomy.engine.block_keys import KeyChain

_IntArray = npt.NDArray[np.int64]
BlockVector = _IntArray
"""Block ids as an int64 vector (what the pool's vector calls take and give)."""

NO_BLOCKS: BlockVector = np.zeros(0, dtype=np.int64)
NO_BLOCKS.flags.writeable = False

_MIN_SLOTS = 4096
"""The slot space's size at first: it doubles as runs need it (after :meth:`BlockPool._collect`)."""

_SCAN_AS_LIST = 64
"""Runs shorter than this are scanned as a Python list (numpy's per-call cost is higher there)."""


def _ids(blocks: list[int]) -> _IntArray:
    """Block ids as an int64 vector (``fromiter`` converts a list about twice as fast as ``asarray``)."""
    return np.fromiter(blocks, dtype=np.int64, count=len(blocks))


class BlockIds:
    """A request's blocks, in order: a growable int64 vector, so the pool's vector calls take a
    request's blocks without converting a list (a long prompt holds thousands of blocks)."""

    __slots__ = ("_buf", "_n")

    def __init__(self, *parts: _IntArray) -> None:
        n = sum(len(p) for p in parts)
        self._buf: _IntArray = np.empty(max(8, n + n // 4), dtype=np.int64)
        self._n = n
        if len(parts) == 1:
            self._buf[:n] = parts[0]
        elif parts:
            np.concatenate(parts, out=self._buf[:n])

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> int:
        if not -self._n <= index < self._n:
            raise IndexError(f"block index {index} out of range for {self._n} blocks")
        block: int = self._buf.item(index if index >= 0 else self._n + index)
        return block

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids().tolist())

    def __repr__(self) -> str:
        return f"BlockIds({self.ids().tolist()})"

    def ids(self) -> _IntArray:
        """The blocks as a vector (a view: valid until the next append)."""
        return self._buf[: self._n]

    def append(self, block: int) -> None:
        n = self._n
        if n == len(self._buf):
            self._grow(n + 1)
        self._buf[n] = block
        self._n = n + 1

    def extend(self, blocks: _IntArray) -> None:
        n, m = self._n, len(blocks)
        if n + m > len(self._buf):
            self._grow(n + m)
        self._buf[n : n + m] = blocks
        self._n = n + m

    def _grow(self, need: int) -> None:
        buf = np.empty(max(need, 2 * len(self._buf)), dtype=np.int64)
        buf[: self._n] = self._buf[: self._n]
        self._buf = buf


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
        "_runs",
        "_slot_block",
        "_slot_top",
    )

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.num_evicted = 0  # cached blocks whose key allocation dropped, ever (read by traces)
        self.version = 0  # changes whenever the cache gains or loses a key (lookups memoise on it)
        self.ref_cnt: _IntArray = np.zeros(num_blocks, dtype=np.int64)
        self._key_slot: _IntArray = np.full(num_blocks, -1, dtype=np.int64)  # the slot of its key, -1: none
        capacity = 4 * num_blocks + 1024  # compaction runs after about 3 * num_blocks frees
        self._queue: _IntArray = np.zeros(capacity, dtype=np.int64)  # (zeros: no page is touched until used)
        self._head = 0  # entries before it were consumed
        self._tail = 0  # next free slot
        # Position of each block's newest entry (meaningful only for blocks that have an entry:
        # every entry is written together with it).
        self._last_pos: _IntArray = np.zeros(num_blocks, dtype=np.int64)
        self._fresh = 0  # blocks _fresh.. were never allocated: they come first, in id order
        self._runs: dict[int, tuple[int, int]] = {}  # run base -> (first slot, capacity)
        self._slot_block: _IntArray = np.full(_MIN_SLOTS, -1, dtype=np.int64)
        self._slot_top = 0  # slots from here on were never given to a run

    # ---- inspection ---------------------------------------------------------------------------
    def key_of(self, block: int) -> int | None:
        """The key ``block`` is cached under, or None (a scan of the runs: for tests and debugging)."""
        slot = int(self._key_slot[block])
        if slot < 0:
            return None
        for base, (start, cap) in self._runs.items():
            if start <= slot < start + cap:
                return base + slot - start
        raise AssertionError(f"block {block} holds slot {slot}, which no run owns")

    @property
    def cached(self) -> dict[int, int]:
        """Every cached key and its block, as a new dict (a scan of the runs: for tests and debugging)."""
        out: dict[int, int] = {}
        sb = self._slot_block
        for base, (start, cap) in self._runs.items():
            for off, block in enumerate(sb[start : start + cap].tolist()):
                if block >= 0:
                    out[base + off] = block
        return out

    def free_order(self) -> list[int]:
        """Free blocks, next to be evicted first (for tests and debugging)."""
        return list(range(self._fresh, self.num_blocks)) + self._valid_entries().tolist()

    def _valid_entries(self) -> _IntArray:
        """The queue's live entries (freed blocks, LRU first), skipping consumed and stale ones."""
        head, tail = self._head, self._tail
        entries = self._queue[head:tail]
        return entries[self._last_pos[entries] == np.arange(head, tail)]

    def num_evictable(self, blocks: list[int] | _IntArray) -> int:
        """How many of these cached blocks are free (taking them costs free blocks)."""
        if len(blocks) == 0:
            return 0
        return int(np.count_nonzero(self.ref_cnt[blocks] == 0))

    @staticmethod
    def as_ids(blocks: list[int]) -> _IntArray:
        """Block ids as the vector :meth:`num_evictable` and :meth:`touch` take (convert once, use twice)."""
        return _ids(blocks)

    # ---- allocation ---------------------------------------------------------------------------
    def allocate_one(self) -> int:
        """Take one block off the LRU front (the caller checked ``num_free >= 1``): the decode path."""
        if self._fresh < self.num_blocks:
            block = self._fresh
            self._fresh = block + 1
            self.ref_cnt[block] = 1
            self.num_free -= 1
            return block
        queue, last_pos = self._queue, self._last_pos
        head = self._head
        block = queue.item(head)  # .item: a Python int without a numpy scalar in between
        while last_pos.item(block) != head:
            head += 1
            block = queue.item(head)
        self._head = head + 1
        slot = self._key_slot.item(block)
        if slot >= 0:
            self._slot_block[slot] = -1
            self._key_slot[block] = -1
            self.num_evicted += 1
            self.version += 1
        self.ref_cnt[block] = 1
        self.num_free -= 1
        return block

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks off the LRU front (the caller checked ``num_free >= n``)."""
        if n == 1:
            return [self.allocate_one()]
        ids: list[int] = self.allocate_ids(n).tolist()
        return ids

    def allocate_ids(self, n: int) -> _IntArray:
        """:meth:`allocate` as a vector (a new one: the caller may keep it)."""
        if n <= 0:
            return NO_BLOCKS
        queue, last_pos = self._queue, self._last_pos
        head = self._head
        parts: list[_IntArray] = []
        want = n
        fresh = self._fresh
        if fresh < self.num_blocks:
            take = min(want, self.num_blocks - fresh)
            parts.append(np.arange(fresh, fresh + take, dtype=np.int64))
            self._fresh = fresh + take
            want -= take
        while want:
            batch = queue[head : head + want]
            valid = last_pos[batch] == np.arange(head, head + want)
            head += want
            if valid.all():
                parts.append(batch)
                break
            batch = batch[valid]
            parts.append(batch)
            want -= len(batch)
        self._head = head
        blocks = parts[0] if len(parts) == 1 else np.concatenate(parts)
        slots = self._key_slot[blocks]
        keyed = slots >= 0
        if keyed.any():
            # Evict: these blocks' contents are about to be overwritten.
            self._slot_block[slots[keyed]] = -1
            self._key_slot[blocks[keyed]] = -1
            self.num_evicted += int(np.count_nonzero(keyed))
            self.version += 1
        self.ref_cnt[blocks] = 1
        self.num_free -= n
        return blocks if blocks.base is None else blocks.copy()  # never a view of the queue

    def touch(self, blocks: list[int] | _IntArray) -> None:
        """Take a reference on cached blocks (prefix hits, retention); free ones stop being free.

        An int64 array (from :meth:`as_ids`) is used as is, without a second conversion.
        """
        if len(blocks) == 0:
            return
        ids = blocks if isinstance(blocks, np.ndarray) else _ids(blocks)
        ref = self.ref_cnt
        counts = ref[ids]
        was_free = counts == 0
        n_free = int(np.count_nonzero(was_free))
        if n_free and self._fresh < self.num_blocks and int(ids[was_free].max()) >= self._fresh:
            self._absorb_fresh()  # a never-allocated block leaves the queue's middle: give it an entry
        if n_free:
            self._last_pos[ids[was_free]] = -1  # their queue entries become stale
            self.num_free -= n_free
        ref[ids] = counts + 1

    def release(self, blocks: list[int] | _IntArray) -> None:
        """Drop one reference on each block, in reverse order.

        Reverse order puts a request's tail blocks in the queue first, so they are evicted before
        its head blocks: the head is the prefix other requests are most likely to share.
        """
        if len(blocks) == 0:
            return
        ids = (blocks if isinstance(blocks, np.ndarray) else _ids(blocks))[::-1]
        ref = self.ref_cnt
        counts = ref[ids] - 1
        ref[ids] = counts
        freed = ids[counts == 0]
        n = len(freed)
        if not n:
            return
        if self._tail + n > len(self._queue):
            self._compact()
        tail = self._tail
        self._queue[tail : tail + n] = freed
        self._last_pos[freed] = np.arange(tail, tail + n)
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

    # ---- prefix cache: lookups ------------------------------------------------------------------
    def block_of(self, base: int, offset: int = 0) -> int | None:
        """The block caching key ``base + offset`` of the run ``base``, or None (a single key: ``base``)."""
        entry = self._runs.get(base)
        if entry is None or offset >= entry[1]:
            return None
        block: int = self._slot_block.item(entry[0] + offset)
        return block if block >= 0 else None

    def cached_prefix(self, chain: KeyChain, limit: int, start: int = 0) -> int:
        """Length of the longest cached prefix of the chain's first ``limit`` keys, given that its
        first ``start`` are cached (``start <= limit``; the chain has computed ``limit`` keys)."""
        if start >= limit:
            return limit
        firsts, bases, counts = chain.run_first, chain.run_base, chain.run_count
        runs, sb = self._runs, self._slot_block
        r = bisect_right(firsts, start) - 1
        n = start
        while n < limit:
            first = firsts[r]
            entry = runs.get(bases[r])
            if entry is None:
                return n
            slot, cap = entry
            run_end = first + counts[r]
            end = min(run_end, limit, first + cap)
            if end > n:
                seg = sb[slot + n - first : slot + end - first]
                if end - n < _SCAN_AS_LIST:
                    held = seg.tolist()
                    if -1 in held:
                        return n + held.index(-1)
                elif seg.min() < 0:
                    return n + int(np.argmax(seg < 0))
                n = end
            if n < limit and n < run_end:
                return n  # the run's slots end before the chain's run: the next key is not cached
            r += 1
        return limit

    def chain_block_ids(self, chain: KeyChain, n: int) -> _IntArray:
        """The blocks caching the chain's first ``n`` keys (all cached: ``cached_prefix >= n``), as a
        vector that may be a view of the cache: copy it before the cache changes."""
        firsts, bases, counts = chain.run_first, chain.run_base, chain.run_count
        runs, sb = self._runs, self._slot_block
        parts: list[_IntArray] = []
        r = 0
        while r < len(firsts) and firsts[r] < n:
            slot = runs[bases[r]][0]
            parts.append(sb[slot : slot + min(counts[r], n - firsts[r])])
            r += 1
        if not parts:
            return NO_BLOCKS
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def chain_blocks(self, chain: KeyChain, n: int) -> list[int]:
        """:meth:`chain_block_ids` as a list."""
        ids: list[int] = self.chain_block_ids(chain, n).tolist()
        return ids

    # ---- prefix cache: registration -------------------------------------------------------------
    def register_one(self, block: int, base: int, offset: int = 0, run_count: int = 1) -> None:
        """Make a just-filled block findable under key ``base + offset`` of its run (``run_count``
        keys long; a single key: ``base``). A key cached already keeps its block."""
        slot = self._intern(base, max(run_count, offset + 1)) + offset
        if self._slot_block.item(slot) < 0:
            self._slot_block[slot] = block
            self._key_slot[block] = slot
            self.version += 1

    def register(self, blocks: list[int], keys: list[int]) -> None:
        """:meth:`register_one` of each block under a single key (no run): for tests and callers
        without a chain."""
        for block, key in zip(blocks, keys, strict=True):
            self.register_one(block, key)

    def register_chain(self, blocks: list[int] | _IntArray, chain: KeyChain, index: int) -> None:
        """Make just-filled blocks findable as the chain's keys ``index, index + 1, ...`` (computed).

        When a key is already cached (two requests computed the same prefix at once), the block
        registered first keeps it and the newcomer stays unkeyed.
        """
        firsts, bases, counts = chain.run_first, chain.run_base, chain.run_count
        r = bisect_right(firsts, index) - 1
        n = len(blocks)
        if n == 1:
            self.register_one(int(blocks[0]), bases[r], index - firsts[r], counts[r])
            return
        # Room for every run first: a collection while interning would move slots already computed.
        last = bisect_right(firsts, index + n - 1)
        self._reserve(sum(counts[r:last]))
        # One vector of slots for all the blocks (a run's slots are consecutive), then one update.
        shifts: list[int] = []  # slot minus block index, per run
        takes: list[int] = []
        i, end = index, index + n
        while i < end:
            first, count = firsts[r], counts[r]
            take = min(first + count, end) - i
            shifts.append(self._intern(bases[r], count) - first)
            takes.append(take)
            i += take
            r += 1
        if len(takes) == 1:
            slots = np.arange(index + shifts[0], end + shifts[0], dtype=np.int64)
        else:
            slots = np.repeat(np.array(shifts, dtype=np.int64), takes) + np.arange(index, end, dtype=np.int64)
        ids = blocks if isinstance(blocks, np.ndarray) else _ids(blocks)
        sb = self._slot_block
        held = sb[slots]
        fresh = (held < 0) | (held == ids)
        if not fresh.all():
            ids, slots = ids[fresh], slots[fresh]
            if not len(ids):
                return
        sb[slots] = ids
        self._key_slot[ids] = slots
        self.version += 1

    # ---- slots ----------------------------------------------------------------------------------
    def _intern(self, base: int, cap: int) -> int:
        """The first slot of run ``base``, given at least ``cap`` slots (a run outgrowing its slots
        moves to new ones, its cached blocks with it)."""
        entry = self._runs.get(base)
        if entry is not None and entry[1] >= cap:
            return entry[0]
        self._reserve(cap)
        entry = self._runs.get(base)  # (a collection may have moved it)
        start = self._slot_top
        self._slot_top = start + cap
        sb = self._slot_block
        if entry is not None:
            old, old_cap = entry
            seg = sb[old : old + old_cap].copy()
            sb[start : start + old_cap] = seg
            sb[old : old + old_cap] = -1
            held = np.flatnonzero(seg >= 0)
            self._key_slot[seg[held]] = held + start
        self._runs[base] = (start, cap)
        return start

    def _reserve(self, n: int) -> None:
        """Make room for ``n`` more slots: collect dead runs when full, and grow if that is not enough."""
        if self._slot_top + n > len(self._slot_block):
            self._collect(n)

    def _collect(self, n: int) -> None:
        """Move the runs that cache a block to the slot space's front (dropping the rest), and
        size the space to at least four times what they and ``n`` more slots need."""
        sb = self._slot_block
        bases = list(self._runs)
        spans = list(self._runs.values())
        starts = np.array([s for s, _ in spans], dtype=np.int64)
        caps = np.array([c for _, c in spans], dtype=np.int64)
        held = np.concatenate(([0], np.cumsum(sb[: self._slot_top] >= 0)))
        live = np.flatnonzero(held[starts + caps] - held[starts] > 0)
        starts, caps = starts[live], caps[live]
        total = int(caps.sum())
        new_starts = np.cumsum(caps) - caps
        size = len(sb)
        while size < 4 * (total + n):  # a quarter in use at most: collections stay rare
            size *= 2
        new_sb = np.full(size, -1, dtype=np.int64)
        if total:
            new_sb[:total] = sb[np.repeat(starts - new_starts, caps) + np.arange(total)]
        slots = np.flatnonzero(new_sb[:total] >= 0)
        self._key_slot[new_sb[slots]] = slots
        self._runs = dict(zip([bases[i] for i in live.tolist()],
                              zip(new_starts.tolist(), caps.tolist(), strict=True), strict=True))
        self._slot_block = new_sb
        self._slot_top = total
