"""The prefix cache's index: cached keys by *run*, each run a range of slots holding its blocks.

A key chain (``engine/block_keys.py``) keys a run of blocks ``base + 0, base + 1, ...``. The
index gives each run it caches a range of *slots* (``_runs[base]``: first slot and capacity, packed), and
``slot_block[slot]`` is the block caching that key (-1: none); the pool keeps the reverse, each
block's slot (``key_slot``, -1: no key). A single key (a block straddling pieces, a request's own
block) is a run of one, its key its base. So a prompt's hundreds of blocks are looked up,
registered and evicted as a few vector operations on slots, without a dictionary operation per
block.

A run that outgrows its slots (a session's stream, longer every turn) moves to new ones, its
cached blocks with it, taking twice its old room at least: it moves O(log length) times. A run
whose blocks were all evicted keeps its slots until the slot space fills; then the live runs move
to its front (:meth:`RunSlots._collect`) and the space is sized to at least eight times what they
need, so collections stay rare.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Final, cast

import numpy as np

from tokenomy.engine.block_ids import NO_BLOCKS, BlockVector
from tokenomy.engine.block_keys import KeyChain

MIN_SLOTS = 4096
"""The slot space's size at first (default): it doubles as runs need it (after :meth:`RunSlots._collect`)."""

_CAP_BITS: Final = 32
_CAP_MASK: Final = (1 << _CAP_BITS) - 1
"""A run's entry is one int, ``first slot << _CAP_BITS | capacity`` (no tuple to build, box and
unpack per run interned or looked up)."""


class RunSlots:
    """Cached keys by run: ``slot_block`` by slot, each run's slots, and ``key_slot`` (shared with the
    pool, which evicts by it) kept the reverse of ``slot_block``."""

    __slots__ = ("key_slot", "slot_block", "slot_view", "_runs", "_top", "collections", "runs_dropped")

    def __init__(self, key_slot: BlockVector, min_slots: int = MIN_SLOTS) -> None:
        self.key_slot = key_slot  # the pool's array: block -> slot of its key, -1: none
        self.slot_block: BlockVector = np.full(min_slots, -1, dtype=np.int64)
        self.slot_view = self.slot_block.data  # the same, for one slot at a time (cheaper than numpy's)
        self.collections = 0  # times the slot space filled (read by tests)
        self.runs_dropped = 0  # runs those collections dropped (no block cached any more)
        # Run base -> first slot << _CAP_BITS | capacity. Bases are read from a chain's list as the
        # objects stored there (compiled, an int would be unboxed and boxed anew for each lookup).
        self._runs: dict[object, int] = {}
        self._top = 0  # slots from here on were never given to a run

    def key_at(self, slot: int) -> int:
        """The key slot ``slot`` stands for (a scan of the runs: for tests and debugging)."""
        for base, entry in self._runs.items():
            start, cap = entry >> _CAP_BITS, entry & _CAP_MASK
            if start <= slot < start + cap:
                return cast(int, base) + slot - start
        raise AssertionError(f"slot {slot} belongs to no run")

    def cached(self) -> dict[int, int]:
        """Every cached key and its block, as a new dict (a scan of the runs: for tests and debugging)."""
        out: dict[int, int] = {}
        sb = self.slot_block
        for base, entry in self._runs.items():
            start, cap = entry >> _CAP_BITS, entry & _CAP_MASK
            for off, block in enumerate(sb[start : start + cap].tolist()):
                if block >= 0:
                    out[cast(int, base) + off] = block
        return out

    # ---- lookups --------------------------------------------------------------------------------
    def block_of(self, base: int, offset: int = 0) -> int | None:
        """The block caching key ``base + offset`` of the run ``base``, or None (a single key: ``base``)."""
        entry = self._runs.get(base)
        if entry is None or offset >= entry & _CAP_MASK:
            return None
        block = self.slot_view[(entry >> _CAP_BITS) + offset]
        return block if block >= 0 else None

    def cached_prefix(self, chain: KeyChain, limit: int, start: int = 0) -> int:
        """Length of the longest cached prefix of the chain's first ``limit`` keys, given that its
        first ``start`` are cached (``start <= limit``; the chain has computed ``limit`` keys)."""
        if start >= limit:
            return limit
        firsts, counts = chain.run_first, chain.run_count
        bases = cast("list[object]", chain.run_base)
        runs, sb = self._runs, self.slot_block
        r = bisect_right(firsts, start) - 1
        n = start
        stop = limit  # where the runs' slots end short of ``limit``, if they do
        # Keys found slotted but not yet checked: slots lo..hi - 1, keys from ``lo_key`` on. Runs
        # interned one after another adjoin in slot space, so one scan checks many runs.
        lo = hi = -1
        lo_key = start
        while n < limit:
            first = firsts[r]
            entry = runs.get(bases[r])
            if entry is None:
                stop = n
                break
            slot, cap = entry >> _CAP_BITS, entry & _CAP_MASK
            run_end = first + counts[r]
            end = min(run_end, limit, first + cap)
            if end > n:
                at = slot + n - first
                if at != hi:
                    missing = _first_empty(sb, lo, hi)
                    if missing >= 0:
                        return lo_key + missing
                    lo, lo_key = at, n
                hi = slot + end - first
                n = end
            if n < limit and n < run_end:
                stop = n  # the run's slots end before the chain's run: the next key is not cached
                break
            r += 1
        missing = _first_empty(sb, lo, hi)
        return lo_key + missing if missing >= 0 else stop

    def chain_block_ids(self, chain: KeyChain, n: int) -> BlockVector:
        """The blocks caching the chain's first ``n`` keys (all cached: ``cached_prefix >= n``), as a
        vector that may be a view of the cache: copy it before the cache changes."""
        firsts, counts = chain.run_first, chain.run_count
        bases = cast("list[object]", chain.run_base)
        runs, sb = self._runs, self.slot_block
        parts: list[BlockVector] = []
        lo = hi = 0  # the span of consecutive slots being gathered (runs interned in order adjoin)
        r = 0
        while r < len(firsts) and firsts[r] < n:
            slot = runs[bases[r]] >> _CAP_BITS
            if slot != hi:
                if hi > lo:
                    parts.append(sb[lo:hi])
                lo = slot
            hi = slot + min(counts[r], n - firsts[r])
            r += 1
        if hi > lo:
            parts.append(sb[lo:hi])
        if not parts:
            return NO_BLOCKS
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def chain_spans(self, chain: KeyChain, index: int, n: int) -> tuple[list[int], list[int]]:
        """The slots of the chain's keys ``index .. index + n - 1`` (computed), its runs given slots
        where they had none, as spans of consecutive slots (first slot, keys): each a slice of
        ``slot_block``. A run's slots are consecutive, and so are the runs of a chain interned one
        after another (a new prompt's runs, registered in order), so a span covers many runs."""
        firsts, counts = chain.run_first, chain.run_count
        bases = cast("list[object]", chain.run_base)
        r = bisect_right(firsts, index) - 1
        last = bisect_right(firsts, index + n - 1)
        if last - r == 1:  # one run, the common case
            start = self.intern(bases[r], counts[r])
            return [start + index - firsts[r]], [n]
        # Each run's entry looked up once. Room for every run first: a collection while placing
        # them would move slots already given. A collection moves the entries too (look them up
        # again), and a run it dropped (none of its blocks cached) now needs slots of its own.
        runs = self._runs
        entries = [runs.get(bases[k]) for k in range(r, last)]
        need = _needs(entries, counts, r)
        while self._top + need > len(self.slot_block):
            self._collect(need)
            runs = self._runs  # (a new dict)
            entries = [runs.get(bases[k]) for k in range(r, last)]
            need = _needs(entries, counts, r)
        starts: list[int] = []
        takes: list[int] = []
        i, end = index, index + n
        j = 0
        while i < end:
            first, count = firsts[r], counts[r]
            take = min(first + count, end) - i
            start = self._place(bases[r], entries[j], count) + i - first
            if starts and starts[-1] + takes[-1] == start:
                takes[-1] += take  # runs interned one after another sit in consecutive slots: one span
            else:
                starts.append(start)
                takes.append(take)
            i += take
            r += 1
            j += 1
        return starts, takes

    # ---- slots ----------------------------------------------------------------------------------
    def intern(self, base: object, cap: int) -> int:
        """The first slot of run ``base``, given at least ``cap`` slots (a run outgrowing its slots
        moves to new ones, its cached blocks with it: :func:`_grown`)."""
        return self._place(base, self._runs.get(base), cap)

    def _place(self, base: object, entry: int | None, cap: int) -> int:
        """:meth:`intern` with the run's entry looked up (``entry``: ``_runs.get(base)``)."""
        cap = _grown(entry, cap)
        if cap == 0:
            assert entry is not None
            return entry >> _CAP_BITS
        if self._top + cap > len(self.slot_block):
            self._collect(cap)
            entry = self._runs.get(base)  # (the collection moved it)
        start = self._top
        self._top = start + cap
        sb = self.slot_block
        if entry is not None:
            old, old_cap = entry >> _CAP_BITS, entry & _CAP_MASK
            seg = sb[old : old + old_cap].copy()
            sb[start : start + old_cap] = seg
            sb[old : old + old_cap] = -1
            held = (seg >= 0).nonzero()[0]
            self.key_slot[seg[held]] = held + start
        self._runs[base] = start << _CAP_BITS | cap
        return start

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more slots: collect dead runs when full, and grow if that is not enough."""
        if self._top + n > len(self.slot_block):
            self._collect(n)

    def _collect(self, n: int) -> None:
        """Move the runs that cache a block to the slot space's front (dropping the rest), and
        size the space to at least eight times what they and ``n`` more slots need."""
        sb = self.slot_block
        bases = list(self._runs)
        packed = np.fromiter(self._runs.values(), dtype=np.int64, count=len(bases))
        starts, caps = packed >> _CAP_BITS, packed & _CAP_MASK
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
        while size < 8 * (total + n):  # an eighth in use at most: collections stay rare
            size *= 2
        moved = sb[(starts - new_starts).repeat(caps) + np.arange(total)]  # (a copy: safe to write back)
        if size == len(sb):
            # The same size: compacted in place (an array as large again, fresh from the OS, costs
            # more to fill than the slots in use to clear; slots from _top on are empty already).
            new_sb = sb
            new_sb[total : self._top] = -1
        else:
            new_sb = np.empty(size, dtype=np.int64)
            new_sb[total:] = -1
        new_sb[:total] = moved
        slots = (moved >= 0).nonzero()[0]
        self.key_slot[new_sb[slots]] = slots
        self.collections += 1
        self.runs_dropped += len(bases) - len(live)
        self._runs = dict(zip([bases[i] for i in live.tolist()], (new_starts << _CAP_BITS | caps).tolist(),
                              strict=True))
        self.slot_block = new_sb
        self.slot_view = new_sb.data
        self._top = total


def _grown(entry: int | None, cap: int) -> int:
    """Slots a run with slots ``entry`` (its packed first slot and capacity; None: none yet) takes to hold ``cap``
    keys: 0 when it has them, twice its old capacity at least when it moves (a session's stream,
    longer every turn, moves O(log length) times instead of every turn, and leaves less dead space
    to collect)."""
    if entry is None:
        return cap
    have = entry & _CAP_MASK
    return 0 if have >= cap else max(cap, 2 * have)


def _needs(entries: list[int | None], counts: list[int], r: int) -> int:
    """Slots placing runs ``r, r + 1, ...`` (their ``entries``) takes (:func:`_grown` of each)."""
    need = 0
    for j, entry in enumerate(entries):
        need += _grown(entry, counts[r + j])
    return need


def _first_empty(sb: BlockVector, lo: int, hi: int) -> int:
    """Offset from ``lo`` of the first slot in ``lo .. hi - 1`` holding no block, or -1 (none, or
    an empty range)."""
    if hi - lo == 1:
        return 0 if sb.item(lo) < 0 else -1
    if hi <= lo:
        return -1
    # The first -1 is the first minimum (blocks are >= 0): argmin finds it without a temporary
    # (a tenth of seg.min()'s cost, numpy's reductions go through Python).
    seg = sb[lo:hi]
    at = int(seg.argmin())
    return at if seg.item(at) < 0 else -1
