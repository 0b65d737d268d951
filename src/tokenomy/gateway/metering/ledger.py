"""The usage ledger: one idempotent event per request id, durable before the client sees completion.

:class:`Ledger` is the interface the request path uses (the record step of
:mod:`tokenomy.gateway.http.proxy`); :class:`tokenomy.gateway.stores.ledger_sql.SqlLedger` is the
embedded default (SQLAlchemy Core; SQLite in WAL mode). A PostgreSQL implementation keeps the same
semantics with ``INSERT ... ON CONFLICT (request_id) DO NOTHING``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tokenomy.gateway.metering.meter import SessionState


@dataclass(slots=True)
class UsageEvent:
    """One request, metered (see :mod:`tokenomy.gateway.metering.meter` for the classes). Treat it as
    immutable once recorded; not frozen because a frozen dataclass of 27 fields costs ~7 us more
    to build, once per request."""

    request_id: str
    ts_s: float  # wall-clock time the request finished (Unix seconds)
    tenant_path: str  # "org/team/key" node ids, root first
    key_id: str
    model: str
    backend: str
    endpoint: str  # the client's protocol: "chat" | "completions" | "messages" | "responses"
    stream: bool
    status: int  # HTTP status the client got (499: client went away; 200 also for a cut stream)
    outcome: str  # "ok" | "cut" | "disconnected" | "upstream_error"
    session_id: str
    turn: int
    prompt_tokens: int
    input_tokens: int
    incremental_prefill_tokens: int
    history_tokens: int
    output_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    cost_recomputed_usd: float
    cost_cached_usd: float
    cost_output_usd: float
    cost_usd: float
    cache_savings_usd: float
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    reasoning_tokens: int = 0  # a part of output_tokens (where the backend reports it)
    requested_model: str = ""  # the name the client asked for (an alias of ``model``); "" = ``model``


@dataclass(frozen=True, slots=True)
class UsageFilter:
    """Which events to read. ``tenant_prefix`` matches a node and its whole subtree."""

    tenant_prefix: str | None = None
    key_id: str | None = None
    model: str | None = None
    session_id: str | None = None
    since_s: float | None = None
    until_s: float | None = None
    limit: int = 10_000


class Ledger(Protocol):
    async def record(self, event: UsageEvent, alone: bool = False) -> None:
        """Store ``event`` durably; a second event with the same request id is ignored.

        ``alone``: the caller knows no other request can record in the meantime (none is in
        flight), so waiting to group this event with others would only add a loop turn."""
        ...

    async def session_state(self, key_id: str, session_id: str) -> SessionState | None:
        """The session's last metered turn, or None when it has none."""
        ...

    async def exists(self, request_id: str) -> bool:
        """Whether an event with this request id is recorded (a client reusing an id is refused)."""
        ...

    def cost_usd(self, request_id: str) -> float | None:
        """The recorded cost of ``request_id``, None when it has no event (reconciling old holds)."""
        ...

    def query(self, flt: UsageFilter) -> list[UsageEvent]:
        """Events matching ``flt``, oldest first (blocking; call from a thread in async code)."""
        ...

    def close(self) -> None: ...
