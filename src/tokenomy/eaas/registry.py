"""Control plane: which server hosts which expert, who is healthy, and how much each one serves.

``Registry`` is the authoritative table (servers register, deregister, drain; a client reports
failures). ``RoutingTable`` is a client's local view of it: it adds the client's own masks, so a
client that sees a server fail stops using it at once, without waiting for anyone else. A server that
registers again gets a new epoch, which clears every client's mask for it: recovered and new servers
get traffic without a restart of anything.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum


class ServerState(Enum):
    ACTIVE = "active"      # receives new requests
    DRAINING = "draining"  # finishes what it has, gets nothing new
    FAILED = "failed"      # masked after an error or timeout until it registers again


@dataclass(frozen=True)
class ServerEntry:
    server_id: str
    address: str
    expert_ids: frozenset[int]
    epoch: int
    state: ServerState = ServerState.ACTIVE


class ExpertUnavailable(RuntimeError):
    """No usable server hosts this expert: every replica is failed, draining or masked."""


@dataclass
class Registry:
    """Routing table expert -> servers, server health, and per-expert / per-server load statistics."""

    _servers: dict[str, ServerEntry] = field(default_factory=dict)
    _epochs: itertools.count = field(default_factory=lambda: itertools.count(1))
    version: int = 0  # bumped on every change, so views can cache
    expert_tokens: Counter[int] = field(default_factory=Counter)
    server_tokens: Counter[str] = field(default_factory=Counter)
    events: list[tuple[str, str]] = field(default_factory=list)  # (event, server_id), in order

    def register(self, server_id: str, address: str, expert_ids: Iterable[int]) -> ServerEntry:
        """Add a server or bring a failed/drained one back; it is routable at once."""
        ids = frozenset(expert_ids)
        if not ids:
            raise ValueError(f"server {server_id} registers no experts")
        entry = ServerEntry(server_id, address, ids, next(self._epochs))
        self._servers[server_id] = entry
        self._changed("register", server_id)
        return entry

    def deregister(self, server_id: str) -> None:
        """Remove a server from the table (after a drain, or when it is gone for good)."""
        self._get(server_id)
        del self._servers[server_id]
        self._changed("deregister", server_id)

    def drain(self, server_id: str) -> None:
        """Stop routing new requests to the server; requests already sent still complete."""
        self._set_state(server_id, ServerState.DRAINING, "drain")

    def mark_failed(self, server_id: str, epoch: int) -> None:
        """Mask a server that failed a request. Ignored if it has re-registered since (newer epoch)."""
        entry = self._servers.get(server_id)
        if entry is not None and entry.epoch == epoch and entry.state is ServerState.ACTIVE:
            self._set_state(server_id, ServerState.FAILED, "failed")

    def servers(self) -> list[ServerEntry]:
        return list(self._servers.values())

    def active_for(self, expert_id: int) -> list[ServerEntry]:
        """Active servers hosting ``expert_id``, in registration order."""
        return [s for s in self._servers.values() if s.state is ServerState.ACTIVE and expert_id in s.expert_ids]

    def record(self, server_id: str, expert_id: int, n_tokens: int) -> None:
        """Count tokens served; these statistics drive hot-expert replication."""
        self.expert_tokens[expert_id] += n_tokens
        self.server_tokens[server_id] += n_tokens

    def _get(self, server_id: str) -> ServerEntry:
        try:
            return self._servers[server_id]
        except KeyError:
            known = ", ".join(sorted(self._servers)) or "none"
            raise KeyError(f"unknown server {server_id!r}; registered: {known}") from None

    def _set_state(self, server_id: str, state: ServerState, event: str) -> None:
        e = self._get(server_id)
        self._servers[server_id] = ServerEntry(e.server_id, e.address, e.expert_ids, e.epoch, state)
        self._changed(event, server_id)

    def _changed(self, event: str, server_id: str) -> None:
        self.version += 1
        self.events.append((event, server_id))


@dataclass
class RoutingTable:
    """A client's view: the registry's active servers minus the ones this client has masked.

    Replicas of an expert are used round-robin, so an expert with r replicas sends each about 1/r of
    its groups: this is the load split the rebalancing plan assumes.
    """

    registry: Registry
    _masked: set[tuple[str, int]] = field(default_factory=set)  # (server_id, epoch)
    _cursor: Counter[int] = field(default_factory=Counter)

    def candidates(self, expert_id: int) -> list[ServerEntry]:
        return [s for s in self.registry.active_for(expert_id) if (s.server_id, s.epoch) not in self._masked]

    def pick(self, expert_id: int, exclude: frozenset[str] = frozenset()) -> ServerEntry:
        """Next usable replica of ``expert_id`` (round-robin), skipping ``exclude``."""
        options = [s for s in self.candidates(expert_id) if s.server_id not in exclude]
        if not options:
            raise ExpertUnavailable(f"no usable server for expert {expert_id} "
                                    f"(registered: {sorted(s.server_id for s in self.registry.servers())}, "
                                    f"masked here: {sorted(sid for sid, _ in self._masked)})")
        i = self._cursor[expert_id]
        self._cursor[expert_id] += 1
        return options[i % len(options)]

    def mask(self, entry: ServerEntry) -> None:
        """Stop using this registration of the server here, and report it to the registry."""
        self._masked.add((entry.server_id, entry.epoch))
        self.registry.mark_failed(entry.server_id, entry.epoch)

    def is_masked(self, entry: ServerEntry) -> bool:
        return (entry.server_id, entry.epoch) in self._masked
