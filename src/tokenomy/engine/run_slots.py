"""The prefix cache's index: cached keys by *run*, each run a range of slots holding its blocks.

A key chain (``engine/block_keys.py``) keys a run of blocks ``base + 0, base + 1, ...``. The
index gives each run it caches a range of *slots* (``_runs[base] = (first slot, capacity)``), and
``slot_block[slot]`` is the block caching that key (-1: none); the pool keeps the reverse, each
block's slot (``key_slot``, -1: no key). A single key (a block straddling pieces, a request's own
block) is a run of one, its key its base. So a prompt's hundreds of blocks are looked up,
registered and evicted as a few vector operations on slots, without a dictionary operation per
block.

A run that outgrows its slots (a session's stream, longer every turn) moves to new ones, its
cached blocks with it, taking twice its old room at least: it moves O(log length) times. A run
whose blocks were all evicted keeps its slots until the slot space fills; then the live runs move
to its front (:meth:`RunSlots._collect`) and the space is sized to at least four times what they
need, so collections stay rare.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from tokenomy.engine.block_ids import NO_BLOCKS, BlockVector
from tokenomy.engine.block_keys import KeyChain

MIN_SLOTS = 4096
"""The slot space's size at first (default): it doubles as runs need it (after :meth:`RunSlots._collect`)."""


class RunSlots:
    """Cached keys by run: ``slot_block`` by slot, each run's slots, and ``key_slot`` (shared with the
    pool, which evicts by it) kept the reverse of ``slot_block``."""

    __slots__ = ("key_slot", "slot_block", "_runs", "_top", "collections", "runs_dropped")

    def __init__(self, key_slot: BlockVector, min_slots: int = MIN_SLOTS) -> None:
        self.key_slot = key_slot  # the pool's array: block -> slot of its key, -1: none
        self.slot_block: BlockVector = np.full(min_slots, -1, dtype=np.int64)
        self.collections = 0  # times the slot space filled (read by tests)
        self.runs_dropped = 0  # runs those collections dropped (no block cached any more)
        self._runs: dict[int, tuple[int, int]] = {}  # run base -> (first slot, capacity)
        self._top = 0  # slots from here on were never given to a run

    def key_at(self, slot: int) -> int:
        """The key slot ``slot`` stands for (a scan of the runs: for tests and debugging)."""
        for base, (start, cap) in self._runs.items():
            if start <= slot < start + cap:
                return base + slot - start
        raise AssertionError(f"slot {slot} belongs to no run")

    def cached(self) -> dict[int, int]:
        """Every cached key and its block, as a new dict (a scan of the runs: for tests and debugging)."""
        out: dict[int, int] = {}
        sb = self.slot_block
        for base, (start, cap) in self._runs.items():
            for off, block in enumerate(sb[start : start + cap].tolist()):
                if block >= 0:
                    out[base + off] = block
        return out

    # ---- lookups --------------------------------------------------------------------------------
    def block_of(self, base: int, offset: int = 0) -> int | None:
        """The block caching key ``base + offset`` of the run ``base``, or None (a single key: ``base``)."""
        entry = self._runs.get(base)
        if entry is None or offset >= entry[1]:
            return None
        block: int = self.slot_block.item(entry[0] + offset)
        return block if block >= 0 else None

    def cached_prefix(self, chain: KeyChain, limit: int, start: int = 0) -> int:
        """Length of the longest cached prefix of the chain's first ``limit`` keys, given that its
        first ``start`` are cached (``start <= limit``; the chain has computed ``limit`` keys)."""
        if start >= limit:
            return limit
        firsts, bases, counts = chain.run_first, chain.run_base, chain.run_count
        runs, sb = self._runs, self.slot_block
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
                lo = slot + n - first
                if end - n == 1:
                    if sb.item(lo) < 0:
                        return n
                else:
                    # The first -1 is the first minimum (blocks are >= 0): argmin finds it without
                    # a temporary (a tenth of seg.min()'s cost, numpy's reductions go through Python).
                    seg = sb[lo : slot + end - first]
                    at = int(seg.argmin())
                    if seg.item(at) < 0:
                        return n + at
                n = end
            if n < limit and n < run_end:
                return n  # the run's slots end before the chain's run: the next key is not cached
            r += 1
        return limit

    def chain_block_ids(self, chain: KeyChain, n: int) -> BlockVector:
        """The blocks caching the chain's first ``n`` keys (all cached: ``cached_prefix >= n``), as a
        vector that may be a view of the cache: copy it before the cache changes."""
        firsts, bases, counts = chain.run_first, chain.run_base, chain.run_count
        runs, sb = self._runs, self.slot_block
        parts: list[BlockVector] = []
        r = 0
        while r < len(firsts) and firsts[r] < n:
            slot = runs[bases[r]][0]
            parts.append(sb[slot : slot + min(counts[r], n - firsts[r])])
            r += 1
        if not parts:
            return NO_BLOCKS
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def chain_slots(self, chain: KeyChain, index: int, n: int) -> BlockVector:
        """The slots of the chain's keys ``index .. index + n - 1`` (computed), its runs given slots
        where they had none: one vector across runs (a run's slots are consecutive)."""
        firsts, bases, counts = chain.run_first, chain.run_base, chain.run_count
        r = bisect_right(firsts, index) - 1
        # Room for every run first: a collection while interning would move slots already computed.
        last = bisect_right(firsts, index + n - 1)
        self.reserve(sum([self._new_cap(bases[k], counts[k]) for k in range(r, last)]))
        shifts: list[int] = []  # slot minus block index, per run
        takes: list[int] = []
        i, end = index, index + n
        while i < end:
            first, count = firsts[r], counts[r]
            take = min(first + count, end) - i
            shifts.append(self.intern(bases[r], count) - first)
            takes.append(take)
            i += take
            r += 1
        if len(takes) == 1:
            return np.arange(index + shifts[0], end + shifts[0], dtype=np.int64)
        return np.array(shifts, dtype=np.int64).repeat(takes) + np.arange(index, end, dtype=np.int64)

    # ---- slots ----------------------------------------------------------------------------------
    def _new_cap(self, base: int, cap: int) -> int:
        """Slots :meth:`intern` takes for run ``base`` to hold ``cap`` keys: 0 when it has them, twice
        its old capacity at least when it moves (a session's stream, longer every turn, moves
        O(log length) times instead of every turn, and leaves less dead space to collect)."""
        entry = self._runs.get(base)
        if entry is None:
            return cap
        return 0 if entry[1] >= cap else max(cap, 2 * entry[1])

    def intern(self, base: int, cap: int) -> int:
        """The first slot of run ``base``, given at least ``cap`` slots (a run outgrowing its slots
        moves to new ones, its cached blocks with it: :meth:`_new_cap`)."""
        cap = self._new_cap(base, cap)
        if cap == 0:
            return self._runs[base][0]
        self.reserve(cap)
        entry = self._runs.get(base)  # (a collection may have moved it)
        start = self._top
        self._top = start + cap
        sb = self.slot_block
        if entry is not None:
            old, old_cap = entry
            seg = sb[old : old + old_cap].copy()
            sb[start : start + old_cap] = seg
            sb[old : old + old_cap] = -1
            held = (seg >= 0).nonzero()[0]
            self.key_slot[seg[held]] = held + start
        self._runs[base] = (start, cap)
        return start

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more slots: collect dead runs when full, and grow if that is not enough."""
        if self._top + n > len(self.slot_block):
            self._collect(n)

    def _collect(self, n: int) -> None:
        """Move the runs that cache a block to the slot space's front (dropping the rest), and
        size the space to at least four times what they and ``n`` more slots need."""
        sb = self.slot_block
        bases = list(self._runs)
        spans = list(self._runs.values())
        starts = np.array([s for s, _ in spans], dtype=np.int64)
        caps = np.array([c for _, c in spans], dtype=np.int64)
        # A run is live when its slots hold a block (>= 0, where empty slots are -1): the largest
        # slot value from each run's start to the next run's (in slot order; slots between runs are
        # empty) says so, in one pass over the slots instead of a running count and two gathers.
        order = np.argsort(starts)
        alive = np.empty(len(starts), dtype=np.bool_)
        if len(starts):
            alive[order] = np.maximum.reduceat(sb[: self._top], starts[order]) >= 0
        live = alive.nonzero()[0]
        starts, caps = starts[live], caps[live]
        total = int(caps.sum())
        new_starts = np.cumsum(caps) - caps
        size = len(sb)
        while size < 4 * (total + n):  # a quarter in use at most: collections stay rare
            size *= 2
        new_sb = np.empty(size, dtype=np.int64)
        new_sb.fill(-1)
        if total:
            new_sb[:total] = sb[(starts - new_starts).repeat(caps) + np.arange(total)]
        slots = (new_sb[:total] >= 0).nonzero()[0]
        self.key_slot[new_sb[slots]] = slots
        self.collections += 1
        self.runs_dropped += len(bases) - len(live)
        self._runs = dict(zip([bases[i] for i in live.tolist()],
                              zip(new_starts.tolist(), caps.tolist(), strict=True), strict=True))
        self.slot_block = new_sb
        self._top = total
