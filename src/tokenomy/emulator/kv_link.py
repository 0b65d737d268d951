"""The emulator's inbound KV port on the wall clock: transfers in flight share its bandwidth.

The simulator's ports and this one are the same model (:class:`tokenomy.core.link.SharedLink`,
processor sharing): N concurrent pulls into one instance each take N times as long as one alone.
Time here is modelled seconds (wall seconds / ``time_scale``), as every latency in ``/metrics``.
A pull still in flight ``timeout_s`` after it started is cut (:class:`KVTransferTimeout`).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from tokenomy.core.link import SharedLink


class KVTransferTimeout(Exception):
    """A KV pull was still in flight when its timeout expired."""


@dataclass
class LinkCounters:
    """Totals for ``/metrics`` (modelled seconds)."""

    transfers: int = 0
    timeouts: int = 0
    seconds: float = 0.0  # time from start to through, summed
    wait_seconds: float = 0.0  # beyond what each transfer would have taken alone
    bytes: float = 0.0


class AsyncKVLink:
    """One instance's inbound KV port; create and use inside the running event loop."""

    def __init__(self, bytes_per_s: float, *, latency_s: float = 0.0, time_scale: float = 1.0,
                 timeout_s: float | None = None) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._link = SharedLink(bytes_per_s, latency_s)
        self.time_scale = time_scale
        self.timeout_s = timeout_s
        self.counters = LinkCounters()
        self._waiters: dict[int, asyncio.Future[float]] = {}
        self._ids = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # the modelled time the timer stands for
        self._t0: float | None = None

    def _now(self) -> float:
        loop = asyncio.get_running_loop()
        if self._t0 is None:
            self._t0 = loop.time()
        return (loop.time() - self._t0) / self.time_scale

    async def transfer(self, n_bytes: float) -> float:
        """Move ``n_bytes`` over the port; returns the modelled seconds it took (setup included).
        Raises :class:`KVTransferTimeout` when it is cut."""
        start = self._now()
        key = next(self._ids)
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters[key] = fut
        self._link.start(start, n_bytes, key)
        self._reschedule()
        self.counters.transfers += 1
        try:
            if self.timeout_s is None:
                through = await fut
            else:
                through = await asyncio.wait_for(asyncio.shield(fut), self.timeout_s * self.time_scale)
        except TimeoutError:
            self._cut(key)
            self.counters.timeouts += 1
            raise KVTransferTimeout(
                f"KV transfer of {n_bytes:.0f} bytes still in flight after {self.timeout_s:g} s") from None
        except asyncio.CancelledError:
            self._cut(key)
            raise
        if self._link.latency_s > 0:
            await asyncio.sleep(self._link.latency_s * self.time_scale)
        # The model's time, not when a busy event loop woke up: a late wakeup delays the request
        # but is not link time.
        took = through + self._link.latency_s - start
        alone = n_bytes / self._link.bytes_per_s + self._link.latency_s
        self.counters.seconds += took
        self.counters.wait_seconds += max(0.0, took - alone)
        self.counters.bytes += n_bytes
        return took

    def _cut(self, key: int) -> None:
        self._waiters.pop(key, None)
        if key in self._link:
            self.counters.bytes += self._link.cancel(self._now(), key)
            self._reschedule()

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        nxt = self._link.next_through_s()
        if nxt is not None and self._t0 is not None:
            loop = asyncio.get_running_loop()
            self._timer_at = nxt
            self._timer = loop.call_at(self._t0 + nxt * self.time_scale, self._through)

    def _through(self) -> None:
        self._timer = None
        at = self._timer_at
        for key in self._link.pop_through(at):
            fut = self._waiters.pop(key, None)  # type: ignore[call-overload]
            if fut is not None and not fut.done():
                fut.set_result(at)
        self._reschedule()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
