"""``ops.shared``: state shared by a fleet of gateway replicas (Redis + PostgreSQL). See docs/gateway-ops.md.

Absent (the default), a gateway keeps the embedded stores: memory + SQLite, no service to run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

OutageMode = Literal["fail_closed", "local"]
LedgerOutageMode = Literal["outbox", "refuse"]


class OutageConfig(BaseModel):
    """What a replica does with a request while Redis is unreachable or slower than ``timeout_s``.

    ``fail_closed``: refuse with 503 ``store_unavailable`` and ``retry-after`` (nothing is served
    that could pass a shared limit or budget). ``local``: admit against this replica's in-process
    limits and breakers (each replica then allows a key its full limits, as before the fleet) and
    meter it in the ledger as usual. A key is *budgeted* when any node on its path has a budget;
    spend must never pass a budget, so budgeted keys fail closed by default; unbudgeted keys stay
    available (local) by default.

    ``ledger``: what a replica does while PostgreSQL (the ledger) is unreachable or slower than
    ``ledger_timeout_s``. ``outbox`` (the default): record the event in the replica's local durable
    outbox and keep serving; it drains into PostgreSQL once PostgreSQL answers. ``refuse``: serve
    nothing the ledger could not commit (503 ``ledger_unavailable`` for ``retry_after_s``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    budgeted: OutageMode = "fail_closed"
    unbudgeted: OutageMode = "local"
    retry_after_s: int = Field(default=2, ge=1, description="retry-after of a 503 store_unavailable")
    ledger: LedgerOutageMode = "outbox"
    ledger_timeout_s: float = Field(default=1.0, gt=0, description="a ledger commit slower than this goes to "
                                                                   "the outbox (ledger: outbox)")


class SharedStoresConfig(BaseModel):
    """Redis for limits, holds, breakers, bindings and in-flight counts; PostgreSQL for the ledger
    and the tenant tree. Labelled defaults, to be tuned per fleet (docs/gateway-ops.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    redis_url: str = Field(description="redis://host:port/db")
    postgres_url: str = Field(description="postgresql://user@host:port/db (ledger and tenants)")
    lease_s: float = Field(default=30.0, gt=0, description="a dead replica's slots and holds are reclaimed "
                                                           "this long after its last heartbeat")
    heartbeat_s: float | None = Field(default=None, gt=0, description="lease renewal period; None: lease_s / 3")
    timeout_s: float = Field(default=1.0, gt=0, description="a Redis call slower than this counts as an outage")
    redis_pool_size: int = Field(default=16, ge=1, description="Redis connections per replica")
    postgres_pool_size: int = Field(default=5, ge=1, description="PostgreSQL connections per replica")
    tenants_refresh_s: float = Field(default=1.0, gt=0, description="how often a replica reloads a changed "
                                                                    "tenant tree (revocations take this long)")
    binding_ttl_s: float = Field(default=3600.0, gt=0, description="a session binding ends this long after "
                                                                   "the session's last turn")
    in_flight_period_s: float = Field(default=0.2, gt=0, description="how often a replica publishes its "
                                      "per-backend in-flight counts and reads the others' (routing's view of the "
                                      "other replicas is this old at most)")
    in_flight_lease_s: float = Field(default=2.0, gt=0, description="a replica's published in-flight counts stop "
                                     "counting this long after it last published (a dead replica's vanish)")
    token_flush: int = Field(default=32, ge=1, description="streamed tokens counted locally before they are "
                                                           "added to the shared velocity windows")
    on_outage: OutageConfig = OutageConfig()
    outbox_dir: str = Field(default=".", description="where this replica keeps its ledger outbox (SQLite): "
                            "tokenomy-outbox-<host>-<n>.db, the first n no live replica holds (replicas never "
                            "share one: the file is locked); on the replica's own disk")

    @model_validator(mode="after")
    def _lease_outlives_period(self) -> SharedStoresConfig:
        if self.in_flight_lease_s <= self.in_flight_period_s:
            raise ValueError(f"ops.shared.in_flight_lease_s ({self.in_flight_lease_s:g}) must exceed "
                             f"in_flight_period_s ({self.in_flight_period_s:g}): live replicas' counts would lapse")
        return self

    @property
    def heartbeat_period_s(self) -> float:
        return self.heartbeat_s if self.heartbeat_s is not None else self.lease_s / 3.0
