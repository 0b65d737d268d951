"""KV transfer links: FIFO queues (PCIe to host) and the KV network of shared ports."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenomy.core.link import SharedLink
from tokenomy.sim.loop import EventLoop


@dataclass(slots=True)
class KVLink:
    """One direction of a link that carries KV caches, one transfer at a time (FIFO).

    A transfer of ``n`` bytes that is handed over at ``now`` starts when the link is free and
    takes ``latency_s + n / bytes_per_s``. Queueing on the link is what turns KV transfer into
    a TTFT problem under load (the whitepaper's common bottleneck).
    """

    bytes_per_s: float
    latency_s: float = 0.0
    busy_until_s: float = 0.0
    bytes_sent: int = 0
    transfers: int = 0

    def __post_init__(self) -> None:
        if self.bytes_per_s <= 0:
            raise ValueError(f"link bandwidth must be positive, got {self.bytes_per_s}")

    def done_s(self, now: float, n_bytes: float) -> float:
        """When a transfer of ``n_bytes`` handed over at ``now`` would complete (queue included)."""
        return max(now, self.busy_until_s) + self.latency_s + n_bytes / self.bytes_per_s

    def transfer(self, now: float, n_bytes: int) -> float:
        """Queue a transfer; return the time it completes."""
        done = self.done_s(now, n_bytes)
        self.busy_until_s = done
        self.bytes_sent += n_bytes
        self.transfers += 1
        return done

    def queue_delay_s(self, now: float) -> float:
        return max(0.0, self.busy_until_s - now)


# ---- the KV network: links that concurrent transfers share -------------------------------------
TRANSFER_KINDS = ("prompt_kv", "history_pull", "history_move")
"""What a transfer carries: a prefill's prompt KV to its decode instance; the history a prefill
instance pulls from the decode instance that holds it (AMPD's remote incremental prefill); a
session's history moved after a rebind."""


@dataclass(slots=True)
class _Transfer:
    key: int
    link: str
    kind: str
    n_bytes: float
    start_s: float
    alone_s: float
    on_done: Callable[[], None]
    on_timeout: Callable[[], None] | None
    done: bool = False


@dataclass
class TransferStats:
    """What the KV network did in one run (``SimResult.transfers``).

    ``wait``: a transfer's time beyond what it would have taken alone on its link (its queueing
    behind concurrent transfers); ``bytes``: moved, by link kind and by what was carried;
    ``timeouts``: transfers cut at ``SimConfig.kv_transfer_timeout_s`` (their requests are
    recorded as incomplete, never dropped).
    """

    transfers: int = 0
    timeouts: int = 0
    waits_s: list[float] = field(default_factory=list)
    durations_s: list[float] = field(default_factory=list)
    bytes_by_link: dict[str, float] = field(default_factory=dict)
    bytes_by_kind: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        import numpy as np

        def pct(values: list[float], q: float) -> float | None:
            return float(np.percentile(values, q)) if values else None

        return {
            "transfers": self.transfers,
            "timeouts": self.timeouts,
            "wait_p50_s": pct(self.waits_s, 50),
            "wait_p99_s": pct(self.waits_s, 99),
            "duration_p50_s": pct(self.durations_s, 50),
            "duration_p99_s": pct(self.durations_s, 99),
            "bytes_by_link": dict(self.bytes_by_link),
            "bytes_by_kind": dict(self.bytes_by_kind),
        }


class KVFabric:
    """Every instance's inbound KV ports: NVLink from instances on its node, an RDMA NIC port
    from other nodes. Each port is a :class:`~tokenomy.core.link.SharedLink`: transfers in
    flight on it share its bandwidth (processor sharing), so N concurrent transfers take N
    times as long as one. Instances fill nodes of ``gpus_per_node`` GPUs in the order given
    (None: every instance on its own node, so every transfer crosses the network).

    A transfer still on its port ``timeout_s`` after it started is cut: its ``on_timeout`` runs
    instead of ``on_done`` (the whitepaper's transfer blow-up under high concurrency).
    """

    def __init__(
        self,
        loop: EventLoop,
        ports: dict[str, tuple[float, float]],
        node_of: dict[str, int],
        *,
        latency_s: float,
        timeout_s: float | None = None,
    ) -> None:
        self.loop = loop
        self.node_of = node_of
        self.timeout_s = timeout_s
        self.latency_s = latency_s
        self._links: dict[str, SharedLink] = {}
        for iid, (nvlink, rdma) in ports.items():
            self._links[f"{iid}/nvlink"] = SharedLink(nvlink, latency_s)
            self._links[f"{iid}/rdma"] = SharedLink(rdma, latency_s)
        self._gen = dict.fromkeys(self._links, 0)
        self._live: dict[int, _Transfer] = {}
        self._keys = itertools.count()
        self.stats = TransferStats()

    def port(self, src: str | None, dst: str) -> str:
        same = src is not None and src in self.node_of and self.node_of[src] == self.node_of.get(dst, -1)
        return f"{dst}/nvlink" if same else f"{dst}/rdma"

    def eta_s(self, src: str | None, dst: str, n_bytes: float, now: float) -> float:
        """How long a transfer of ``n_bytes`` started now would take (exact if nothing else starts)."""
        return self._links[self.port(src, dst)].eta_s(now, n_bytes)

    def wait_s(self, src: str | None, dst: str, now: float) -> float:
        """The time the port needs to move what is already on it (the queueing a view shows)."""
        link = self._links[self.port(src, dst)]
        return link.backlog_bytes(now) / link.bytes_per_s

    def send(
        self,
        src: str | None,
        dst: str,
        n_bytes: float,
        now: float,
        on_done: Callable[[], None],
        *,
        kind: str,
        on_timeout: Callable[[], None] | None = None,
    ) -> None:
        """Start a transfer into ``dst`` (from ``src``; None: from another node)."""
        name = self.port(src, dst)
        link = self._links[name]
        key = next(self._keys)
        alone = n_bytes / link.bytes_per_s + link.latency_s
        self._live[key] = _Transfer(key, name, kind, n_bytes, now, alone, on_done, on_timeout)
        link.start(now, n_bytes, key)
        self.stats.transfers += 1
        self._schedule(name)
        if self.timeout_s is not None:
            self.loop.at(now + self.timeout_s, self._expire, key)

    def _schedule(self, name: str) -> None:
        self._gen[name] += 1
        nxt = self._links[name].next_through_s()
        if nxt is not None:
            self.loop.at_private(nxt, self._through, name, self._gen[name])

    def _through(self, name: str, gen: int) -> None:
        if gen != self._gen[name]:
            return  # rescheduled since: a transfer started or was cut on this port
        now = self.loop.now
        for key in self._links[name].pop_through(now):
            t = self._live[key]  # type: ignore[index]  # the fabric's keys are ints
            self.loop.at(now + self._links[name].latency_s, self._finish, key)
            self._account(t, t.n_bytes)
        self._schedule(name)

    def _finish(self, key: int) -> None:
        t = self._live.pop(key, None)
        if t is None or t.done:
            return
        t.done = True
        took = self.loop.now - t.start_s
        self.stats.durations_s.append(took)
        self.stats.waits_s.append(max(0.0, took - t.alone_s))
        t.on_done()

    def _expire(self, key: int) -> None:
        t = self._live.get(key)
        if t is None or t.done:
            return
        link = self._links[t.link]
        if key in link:  # still moving bytes: cut it off the port
            moved = link.cancel(self.loop.now, key)
            self._account(t, moved)
            self._schedule(t.link)
        del self._live[key]
        t.done = True
        self.stats.timeouts += 1
        if t.on_timeout is not None:
            t.on_timeout()

    def _account(self, t: _Transfer, moved: float) -> None:
        kind = t.link.rsplit("/", 1)[1]
        self.stats.bytes_by_link[kind] = self.stats.bytes_by_link.get(kind, 0.0) + moved
        self.stats.bytes_by_kind[t.kind] = self.stats.bytes_by_kind.get(t.kind, 0.0) + moved
