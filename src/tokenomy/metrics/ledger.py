"""Token metering basis (layer 4): usage by class, per tenant and per session.

The whitepaper prices every consumption by class: new input, incremental prefill, output,
and prefix-cache hits versus recomputed tokens. The ledger sums each request's TokenUsage
into per-tenant and per-session totals. It is an in-memory reduction of RequestRecords (for
reports and simulations); the gateway's durable ledger is a separate store.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenomy.core import RequestRecord, TokenUsage


@dataclass(slots=True)
class MeterTotals:
    """Usage summed over some requests, and how many requests that was."""

    requests: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, **self.usage.to_dict()}


class TokenLedger:
    """Accumulates RequestRecords' TokenUsage per tenant and per session.

    Contract: each ``request_id`` is metered once; recording it again raises ValueError, so a
    replayed record cannot double-bill. Sessions are keyed by ``(tenant, session_id)`` because
    session ids are only unique within a tenant; records with an empty ``session_id`` count for
    their tenant and the total but belong to no session. The usage is taken as the record
    carries it: a producer that leaves ``usage`` empty meters zero tokens.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._total = MeterTotals()
        self._tenants: dict[str, MeterTotals] = {}
        self._sessions: dict[tuple[str, str], MeterTotals] = {}

    def record(self, rec: RequestRecord) -> None:
        """Meter one request. Raises ValueError if its ``request_id`` was already metered."""
        if rec.request_id in self._seen:
            raise ValueError(f"request {rec.request_id!r} is already metered")
        self._seen.add(rec.request_id)
        targets = [self._total, self._tenants.setdefault(rec.tenant, MeterTotals())]
        if rec.session_id:
            targets.append(self._sessions.setdefault((rec.tenant, rec.session_id), MeterTotals()))
        for t in targets:
            t.requests += 1
            t.usage.add(rec.usage)

    def record_all(self, records: Iterable[RequestRecord]) -> None:
        for rec in records:
            self.record(rec)

    def total(self) -> MeterTotals:
        """Totals over every metered request (a copy: changing it does not change the ledger)."""
        return _copy(self._total)

    def tenant(self, tenant: str) -> MeterTotals:
        """Totals of one tenant; zeros for a tenant never seen."""
        return _copy(self._tenants.get(tenant, MeterTotals()))

    def session(self, tenant: str, session_id: str) -> MeterTotals:
        """Totals of one session of a tenant; zeros for a session never seen."""
        return _copy(self._sessions.get((tenant, session_id), MeterTotals()))

    def tenants(self) -> dict[str, MeterTotals]:
        return {k: _copy(v) for k, v in sorted(self._tenants.items())}

    def sessions(self) -> dict[tuple[str, str], MeterTotals]:
        return {k: _copy(v) for k, v in sorted(self._sessions.items())}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able report: per-class totals overall, per tenant, and per session under its tenant."""
        per_tenant: dict[str, Any] = {}
        for name, totals in sorted(self._tenants.items()):
            per_tenant[name] = {**totals.to_dict(), "sessions": {}}
        for (tenant, sid), totals in sorted(self._sessions.items()):
            per_tenant[tenant]["sessions"][sid] = totals.to_dict()
        return {"total": self._total.to_dict(), "tenants": per_tenant}


def _copy(t: MeterTotals) -> MeterTotals:
    usage = TokenUsage()
    usage.add(t.usage)
    return MeterTotals(requests=t.requests, usage=usage)
