"""A minimal discrete-event loop on a virtual clock.

Events are ``(time_s, seq, callback, args, private)`` on a heap; ``seq`` is a per-loop counter,
so events at the same time run in the order they were scheduled and two runs of the same
simulation are identical. A place in that order can be taken ahead of the event
(:meth:`EventLoop.reserve_seqs`): a source of many events known in advance (a trace's session
starts) then keeps only its next one on the heap, in the place it would have had.

Lazily advanced objects (simulated instances fast-forwarding a decode run) register with
:meth:`EventLoop.add_lazy`. Before every ordinary event the loop calls ``sync(now)`` on each of
them, so whatever the event reads or changes sees exactly the state a step-by-step simulation
would have at ``now``. *Private* events (:meth:`EventLoop.at_private`) skip that: an object may
use them for its own bookkeeping when the callback reads no other object's state, or syncs
explicitly with :meth:`EventLoop.sync` before it does.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any, Protocol


class Lazy(Protocol):
    def sync(self, now: float) -> None:
        """Bring the object's observable state up to virtual time ``now``."""
        ...

    def settle(self, until_s: float) -> None:
        """The loop stops at ``until_s``: sync, and emit whatever ordinary events up to it would have."""
        ...


class EventLoop:
    """Runs callbacks in virtual time. Callbacks schedule further events; nothing sleeps."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...], bool]] = []
        self._seq = 0  # the next event's place among events at the same time
        self._lazy: dict[int, Lazy] = {}
        self.now = 0.0
        self.events_run = 0

    def at(self, time_s: float, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` at ``time_s`` (never earlier than now), after syncing lazy objects."""
        heapq.heappush(self._heap, (max(time_s, self.now), self.reserve_seq(), callback, args, False))

    def at_in(self, time_s: float, seq: int, callback: Callable[..., None], *args: Any) -> None:
        """:meth:`at` in a place taken by :meth:`reserve_seqs` (or :meth:`reserve_seq`): among events
        at the same time it runs where an event scheduled when the place was taken would have."""
        heapq.heappush(self._heap, (max(time_s, self.now), seq, callback, args, False))

    def at_private(self, time_s: float, callback: Callable[..., None], *args: Any) -> None:
        """Like :meth:`at`, without syncing lazy objects first (see the module docstring)."""
        heapq.heappush(self._heap, (max(time_s, self.now), self.reserve_seq(), callback, args, True))

    def reserve_seq(self) -> int:
        """A place in the order of events scheduled for the same time, taken now, for an event whose
        time is known later (:meth:`at_private_in`)."""
        seq = self._seq
        self._seq = seq + 1
        return seq

    def reserve_seqs(self, n: int) -> int:
        """``n`` consecutive places (:meth:`reserve_seq`), the first returned."""
        first = self._seq
        self._seq = first + n
        return first

    def at_private_in(self, time_s: float, seq: int, callback: Callable[..., None], *args: Any) -> None:
        """:meth:`at_private` in a place taken by :meth:`reserve_seq`: among events at the same time
        it runs where an event scheduled when the place was taken would have. At most one event may
        hold a place in the heap at a time."""
        heapq.heappush(self._heap, (max(time_s, self.now), seq, callback, args, True))

    def add_lazy(self, obj: Lazy) -> None:
        self._lazy[id(obj)] = obj

    def discard_lazy(self, obj: Lazy) -> None:
        self._lazy.pop(id(obj), None)

    def sync(self, now: float) -> None:
        """Bring every lazy object up to ``now``."""
        for obj in list(self._lazy.values()):
            obj.sync(now)

    def run(self, until_s: float = math.inf, on_tick: Callable[[float], None] | None = None) -> None:
        """Process events in time order until the heap is empty or the next event is past ``until_s``;
        lazy objects then settle at ``until_s`` (as if every event up to it had run)."""
        heap = self._heap
        lazy = self._lazy
        pop = heapq.heappop
        while heap and heap[0][0] <= until_s:
            time_s, _, callback, args, private = pop(heap)
            self.now = time_s
            if lazy and not private:
                for obj in list(lazy.values()):
                    obj.sync(time_s)
            callback(*args)
            self.events_run += 1
            if on_tick is not None and not self.events_run & 0xFFF:
                on_tick(time_s)
        if lazy and until_s < math.inf:
            for obj in list(lazy.values()):
                obj.settle(until_s)

    @property
    def pending(self) -> int:
        return len(self._heap)
