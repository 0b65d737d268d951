"""A minimal discrete-event loop on a virtual clock.

Events are ``(time_s, seq, callback, args)`` on a heap; ``seq`` is a per-loop counter, so
events at the same time run in the order they were scheduled and two runs of the same
simulation are identical.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class EventLoop:
    """Runs callbacks in virtual time. Callbacks schedule further events; nothing sleeps."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.now = 0.0
        self.events_run = 0

    def at(self, time_s: float, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` at ``time_s`` (never earlier than now)."""
        heapq.heappush(self._heap, (max(time_s, self.now), next(self._seq), callback, args))

    def run(self, until_s: float = float("inf"), on_tick: Callable[[float], None] | None = None) -> None:
        """Process events in time order until the heap is empty or the next event is past ``until_s``."""
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= until_s:
            time_s, _, callback, args = pop(heap)
            self.now = time_s
            callback(*args)
            self.events_run += 1
            if on_tick is not None and not self.events_run & 0xFFF:
                on_tick(time_s)

    @property
    def pending(self) -> int:
        return len(self._heap)
