"""Host-tier eviction: which offloaded KV copies leave host memory to make room for a new one.

Host memory per instance is bounded. When a new copy of ``need_bytes`` does not fit, the
policy evicts, in this order (docs/ampd.md, "KV retention"):

1. copies past their TTL (the retention policy's hint of how long they are worth keeping),
   oldest stored first;
2. then the least recently stored.

A copy larger than the whole tier is not stored (``store=False``) and nothing is evicted for it.
The caller lists the instance's copies oldest stored first and applies the decision. A caller
that knows the bytes they hold passes ``used_bytes``; then the copies are only read as far as the
decision needs (a full tier holds thousands of copies, mostly expired ones stored long ago).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from tokenomy.policy.trace import TraceSink, emit, fields_dict


class HostCopyView(NamedTuple):
    """One session's KV copy in host memory: its size and until when the retention policy meant to keep it.

    A named tuple (made four times faster than a frozen dataclass): callers may build one per copy
    per decision, thousands on a full tier (the simulator's KV keeper makes one per stored copy)."""

    session_id: str
    kv_bytes: int
    expire_s: float


@dataclass(frozen=True, slots=True)
class HostEvictionDecision:
    """Whether the new copy is stored, which copies to evict first (in order), and why."""

    session_id: str
    store: bool
    evict: tuple[str, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, for the decision trace."""
        return fields_dict(self)


class HostEvictionPolicy:
    """Expired copies first, then least recently stored (module docstring)."""

    def __init__(self, *, trace: TraceSink | None = None) -> None:
        self.trace = trace

    def decide(
        self,
        session_id: str,
        need_bytes: int,
        *,
        copies: Iterable[HostCopyView],
        capacity_bytes: int,
        now: float,
        used_bytes: int | None = None,
    ) -> HostEvictionDecision:
        """Make room for ``need_bytes`` among ``copies`` (oldest stored first) in a tier of ``capacity_bytes``.

        ``copies`` may be iterated more than once (a sequence, or a view that iterates afresh each
        time); ``used_bytes``: their total bytes (default: summed from ``copies``, one more pass).
        The decision goes to the trace sink.
        """
        decision = self._decide(session_id, need_bytes, copies, capacity_bytes, now, used_bytes)
        emit(self.trace, "host_eviction", now, decision)
        return decision

    def _decide(
        self, session_id: str, need_bytes: int, copies: Iterable[HostCopyView], capacity_bytes: int, now: float,
        used_bytes: int | None,
    ) -> HostEvictionDecision:
        if need_bytes < 0 or capacity_bytes < 0:
            raise ValueError("need_bytes and capacity_bytes must be >= 0")
        if need_bytes > capacity_bytes:
            return HostEvictionDecision(session_id, False, (), "larger than the host tier")
        free = capacity_bytes - (sum(c.kv_bytes for c in copies) if used_bytes is None else used_bytes)
        if need_bytes <= free:
            return HostEvictionDecision(session_id, True, (), "fits")
        evict: list[str] = []
        expired = 0
        for c in copies:  # expired ones first, oldest stored first (it does not fit: free < need)
            if c.expire_s < now:
                evict.append(c.session_id)
                free += c.kv_bytes
                expired += 1
                if need_bytes <= free:
                    break
        if need_bytes > free:
            for c in copies:  # then the least recently stored
                if c.expire_s >= now:
                    evict.append(c.session_id)
                    free += c.kv_bytes
                    if need_bytes <= free:
                        break
        why = f"host tier full: evict {expired} expired, {len(evict) - expired} least recently stored"
        return HostEvictionDecision(session_id, True, tuple(evict), why)
