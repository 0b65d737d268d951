"""Chained keys of KV blocks, derived from a request's ``content`` segments.

Block ``i`` covers tokens ``[i * B, (i + 1) * B)``. Its key is a function of the whole token
prefix up to and including it, because so is its KV: two blocks share a key exactly when their
token prefixes are the same (up to 64-bit hash collisions). Contiguous segments of one stream are
merged first, so the same tokens always decompose into the same pieces. A block inside one piece
is keyed by the key before its run of such blocks, the run's start and its own offset (see
``KeyChain.ensure``); a block straddling pieces hashes its parent key with its pieces.

Keys are built from Python ``hash`` values of int tuples: deterministic across processes (ints
and tuples of ints are not salted by PYTHONHASHSEED) and cheap. A run's keys are consecutive ints
(one hash per run, not per block), which is also what keeps the pool's dict lookups local: a
prompt's blocks land in neighbouring slots. Two runs' key ranges overlap with probability about
(runs^2 * blocks per run) / 2^62, the same order as 64-bit hash collisions. Keys are computed
lazily, a run at a time, only when someone needs them (a lookup or a block that just filled).

A content tuple's chain is memoised in a :class:`KeyChainCache` (bounded LRU): it is a pure
function of ``(content, block_size)``, and the router asks every instance about the same content,
so sharing the work is what keeps prefix-aware routing cheap. A cache belongs to whoever creates
it: each engine makes its own unless one is injected (the simulator shares one among the engines
it drives from one thread). There is no process-wide cache: a threaded server's engines do not
share mutable state they did not agree to share.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from typing import Final

from tokenomy.core import Segment

ROOT_KEY: Final = 0
"""Parent key of block 0."""

_RUN_BASE_MASK: Final = (1 << 62) - 1
"""Run bases are 62-bit, so base + offset stays a 64-bit signed int (the pool stores keys in int64)."""

_MEMO_MAX_ENTRIES: Final = 256  # in-flight router lookups; requests keep their own chains


class KeyChain:
    """Keys of the full blocks of one content tuple, as runs; ``key(i)`` is block ``i``'s key once computed."""

    __slots__ = ("block_size", "num_full_blocks", "num_keys", "run_first", "run_base", "run_count", "_pieces",
                 "_piece", "_used")

    def __init__(self, content: tuple[Segment, ...], block_size: int) -> None:
        # Absolute pieces (stream, stream_offset, n_tokens); contiguous pieces of one stream are
        # merged so that the same tokens always decompose the same way (canonical keys).
        pieces: list[tuple[object, int, int]] = []
        stream_end: dict[object, int] = {}
        # Streams as objects: compiled, an int read from a tuple would be unboxed, then boxed anew
        # (an allocation) for each dict operation and tuple it goes into.
        segments: tuple[tuple[object, int], ...] = content
        for stream, n in segments:
            if n < 0:
                raise ValueError(f"content segment ({stream}, {n}) has a negative token count")
            if n == 0:
                continue
            start = stream_end.get(stream, 0)
            stream_end[stream] = start + n
            if pieces and pieces[-1][0] == stream and pieces[-1][1] + pieces[-1][2] == start:
                pieces[-1] = (stream, pieces[-1][1], pieces[-1][2] + n)
            else:
                pieces.append((stream, start, n))
        self.block_size = block_size
        self.num_full_blocks = sum(p[2] for p in pieces) // block_size
        self.num_keys = 0  # blocks whose keys are computed
        # The keys as runs: run r keys blocks run_first[r] .. run_first[r] + run_count[r] - 1 as
        # run_base[r] + offset (a block straddling pieces is a run of one, its key its base). The
        # pool indexes its prefix cache by run, so a run's blocks are looked up in one probe, and
        # no list of per-block keys is ever built.
        self.run_first: list[int] = []
        self.run_base: list[int] = []
        self.run_count: list[int] = []
        self._pieces = pieces
        self._piece = 0  # index of the piece the next block starts in
        self._used = 0  # tokens of that piece already covered by earlier blocks

    def ensure(self, num_blocks: int) -> None:
        """Compute keys until ``num_keys >= min(num_blocks, num_full_blocks)`` (maybe more)."""
        target = min(num_blocks, self.num_full_blocks)
        n = self.num_keys
        if n >= target:
            return
        bs = self.block_size
        pieces = self._pieces
        piece, used = self._piece, self._used
        while n < target:
            parent = self.run_base[-1] + self.run_count[-1] - 1 if n else ROOT_KEY  # the last key
            stream, start, length = pieces[piece]
            avail = length - used
            if avail >= bs:
                # A run: every whole block left in this piece. The run's base is a hash of the
                # key before the run (the anchor) and the stream offset where the run starts;
                # block j of the run is keyed base + j. That pins the whole token prefix without
                # hashing block by block, and consecutive keys sit in consecutive dict slots.
                # A run always extends to the end of its piece, so keys do not depend on how far
                # callers asked.
                count = avail // bs
                base = hash((parent, stream, start + used)) & _RUN_BASE_MASK
                self.run_first.append(n)
                self.run_base.append(base)
                self.run_count.append(count)
                n += count
                used += count * bs
            else:
                # A block straddling pieces: chain it on its parent and its pieces.
                parts: list[object] = [parent]
                need = bs
                while need:
                    stream, start, length = pieces[piece]
                    take = min(need, length - used)
                    parts += (stream, start + used, take)
                    used += take
                    need -= take
                    if used == length:
                        piece, used = piece + 1, 0
                self.run_first.append(n)
                self.run_base.append(hash(tuple(parts)))
                self.run_count.append(1)
                n += 1
            if piece < len(pieces) and used == pieces[piece][2]:
                piece, used = piece + 1, 0
        self._piece, self._used = piece, used
        self.num_keys = n

    def key(self, index: int) -> int:
        """Block ``index``'s key (computed: ``index < num_keys``)."""
        base, offset, _ = self.ref(index)
        return base + offset

    @property
    def keys(self) -> list[int]:
        """Every computed key, as a new list (for tests and debugging)."""
        return [base + j for base, count in zip(self.run_base, self.run_count, strict=True) for j in range(count)]

    def ref(self, index: int) -> tuple[int, int, int]:
        """Block ``index``'s key as ``(run base, offset, run length)`` (computed: ``index < num_keys``)."""
        firsts = self.run_first
        r = len(firsts) - 1
        if index < firsts[r]:  # (not in the last run: a decode step's block mostly is, without a bisect)
            r = bisect_right(firsts, index) - 1
        return self.run_base[r], index - firsts[r], self.run_count[r]


class KeyChainCache:
    """Memoised key chains by ``(content, block_size)``, least recently used dropped first.

    Not thread-safe: share one only among engines driven from one thread.
    """

    __slots__ = ("max_entries", "_memo", "_last")

    def __init__(self, max_entries: int = _MEMO_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"KeyChainCache.max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._memo: OrderedDict[tuple[tuple[Segment, ...], int], KeyChain] = OrderedDict()
        # (content object, block size, chain) of the latest call: the router asks every instance
        # about the same request in a row, and an identity check skips hashing the tuple.
        self._last: tuple[tuple[Segment, ...] | None, int, KeyChain | None] = (None, 0, None)

    def __len__(self) -> int:
        return len(self._memo)

    def get(self, content: tuple[Segment, ...], block_size: int) -> KeyChain:
        """The (shared, lazily extended) key chain of ``content`` for blocks of ``block_size`` tokens."""
        last_content, last_size, last_chain = self._last
        if content is last_content and block_size == last_size and last_chain is not None:
            return last_chain
        memo = self._memo
        memo_key = (content, block_size)
        chain = memo.get(memo_key)
        if chain is None:
            chain = KeyChain(content, block_size)
            memo[memo_key] = chain
            if len(memo) > self.max_entries:
                memo.popitem(last=False)
        else:
            memo.move_to_end(memo_key)
        self._last = (content, block_size, chain)
        return chain


def unique_key(parent: int, owner_uid: int) -> int:
    """Key of a block whose tokens no content describes: shared by nobody but its owner.

    The owner finds it again after a preemption (its own blocks stay cached), nobody else does.
    """
    return hash((parent, owner_uid))
