"""A KV link whose bandwidth is shared by the transfers in flight on it (clock-agnostic).

Processor sharing (each of ``n`` active transfers gets ``bytes_per_s / n``), the fluid model of
a NIC or NVLink port that interleaves concurrent RDMA writes: N transfers of ``b`` bytes
started together all finish at ``N * b / bytes_per_s``, N times as long as one alone. A
transfer also pays ``latency_s`` (connection setup, the perf model's ``kv_transfer_setup_s``)
after its bytes are through. The model is given ``now``; the simulator drives it on the virtual
clock and the emulator on the wall clock.

Exact and O(log n) per event with the usual virtual-time trick: the link's virtual clock ``V``
advances at ``bytes_per_s / n`` per second while ``n > 0``, and a transfer of ``b`` bytes
started at ``V0`` is through when ``V`` reaches ``V0 + b``.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass(slots=True)
class SharedLink:
    """One direction of one link (the inbound port of an instance, say)."""

    bytes_per_s: float
    latency_s: float = 0.0
    _v: float = 0.0
    _t: float = 0.0
    _heap: list[tuple[float, int, Hashable]] = field(default_factory=list)
    _tags: dict[Hashable, tuple[float, float]] = field(default_factory=dict)  # key -> (finish tag, bytes)
    _seq: int = 0
    bytes_sent: float = 0.0
    transfers: int = 0

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(f"link bandwidth must be positive, got {self.bytes_per_s}")
        if self.latency_s < 0:
            raise ValueError(f"link latency must be >= 0, got {self.latency_s}")

    def __contains__(self, key: Hashable) -> bool:
        """Whether ``key``'s bytes are still moving."""
        return key in self._tags

    @property
    def active(self) -> int:
        return len(self._tags)

    def _advance(self, now: float) -> None:
        if now > self._t:
            if self._tags:
                self._v += (now - self._t) * self.bytes_per_s / len(self._tags)
            self._t = now

    def start(self, now: float, n_bytes: float, key: Hashable) -> None:
        """Put ``n_bytes`` on the link at ``now`` (``now`` never before the last call's)."""
        if key in self._tags:
            raise ValueError(f"transfer {key!r} is already on the link")
        if n_bytes < 0:
            raise ValueError(f"a transfer has >= 0 bytes, got {n_bytes}")
        self._advance(now)
        tag = self._v + n_bytes
        self._tags[key] = (tag, n_bytes)
        self._seq += 1
        heapq.heappush(self._heap, (tag, self._seq, key))
        self.transfers += 1

    def _prune(self) -> None:
        """Drop heap entries of cancelled transfers (and of a key since reused)."""
        heap, tags = self._heap, self._tags
        while heap and (heap[0][2] not in tags or tags[heap[0][2]][0] != heap[0][0]):
            heapq.heappop(heap)

    def next_through_s(self) -> float | None:
        """When the next transfer's bytes are through, if nothing else starts meanwhile."""
        self._prune()
        if not self._heap:
            return None
        return self._t + (self._heap[0][0] - self._v) * len(self._tags) / self.bytes_per_s

    def pop_through(self, now: float, eps: float = 1e-9) -> list[Hashable]:
        """Advance to ``now``; remove and return the transfers whose bytes are through by then.

        A transfer is through when its remainder is within ``eps`` of the virtual clock, or when
        the time it still needs is below the clock's resolution at ``now`` (``now`` plus it rounds
        to ``now``): late in a long run a fast port can be left a fraction of a byte short, and
        :meth:`next_through_s` then answers ``now`` itself, so a caller waking up then must get it.
        """
        self._advance(now)
        out: list[Hashable] = []
        while True:
            self._prune()
            if not self._heap:
                return out
            left = self._heap[0][0] - self._v
            if left > eps * max(1.0, self._v) and now + left * len(self._tags) / self.bytes_per_s > now:
                return out
            _, _, key = heapq.heappop(self._heap)
            self.bytes_sent += self._tags.pop(key)[1]
            out.append(key)

    def cancel(self, now: float, key: Hashable) -> float:
        """Take a transfer off the link (a timeout); returns the bytes it had moved."""
        self._advance(now)
        tag, n_bytes = self._tags.pop(key)
        moved = max(0.0, n_bytes - max(0.0, tag - self._v))
        self.bytes_sent += moved
        return moved

    def backlog_bytes(self, now: float) -> float:
        """Bytes still to move on the link."""
        self._advance(now)
        return sum(max(0.0, tag - self._v) for tag, _ in self._tags.values())

    def eta_s(self, now: float, n_bytes: float) -> float:
        """How long a new transfer of ``n_bytes`` would take, if nothing else starts meanwhile:
        under processor sharing every transfer ahead moves ``min(its remaining, n_bytes)`` before
        the new one is through (exact)."""
        self._advance(now)
        shared = sum(min(max(0.0, tag - self._v), n_bytes) for tag, _ in self._tags.values())
        return (shared + n_bytes) / self.bytes_per_s + self.latency_s
