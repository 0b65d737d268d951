"""Deterministic allocation of content stream keys.

A stream key names an append-only token stream (see :mod:`tokenomy.core.request`). Keys
come from a per-call counter, never from ``hash(str)`` (salted per process), so the same
seed yields the same keys in every run. Keys are unique within one allocator: sessions
built from two allocators may collide and must not be mixed in one simulation.
"""

from __future__ import annotations


class StreamKeys:
    """Hands out fresh, never-repeated stream keys, starting at ``first``."""

    def __init__(self, first: int = 0) -> None:
        if first < 0:
            raise ValueError(f"first stream key must be >= 0, got {first}")
        self._next = first

    def new(self) -> int:
        """One fresh key."""
        key = self._next
        self._next += 1
        return key

    def reserve(self, count: int) -> int:
        """Reserve ``count`` consecutive keys; returns the first (callers add an offset)."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        first = self._next
        self._next += count
        return first

    @property
    def next_key(self) -> int:
        """The key :meth:`new` would return next (all keys below it are taken)."""
        return self._next
