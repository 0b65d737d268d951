"""Build one gateway replica of a fleet: the ledger and tenants on PostgreSQL, token operations'
state in Redis (``ops.shared`` in the gateway config; docs/gateway-ops.md, "Running a fleet").

The Guard is the embedded gateway's ``OpsGuard`` over ``RedisState`` instead of ``LocalState``,
with an in-process ``LocalState`` to fall back on while Redis is down (``ops.outage``).
``build_fleet`` is synchronous (the app is built before its event loop runs); ``FleetParts.start``
and ``aclose`` run in the app's lifespan.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from redis.asyncio import Redis

from tokenomy.gateway.ops.config import GatewayConfigLike, ops_config
from tokenomy.gateway.ops.metrics import OpsMetrics
from tokenomy.gateway.ops.ops_guard import OpsGuard
from tokenomy.gateway.ops.outage import LedgerHealth, OutagePolicy
from tokenomy.gateway.ops.tenancy_seed import apply_seeds
from tokenomy.gateway.stores.ledger_sql import usage_events
from tokenomy.gateway.stores.local_state import LocalState
from tokenomy.gateway.stores.outbox import OutboxCollector, open_outbox
from tokenomy.gateway.stores.outbox_ledger import OutboxLedger
from tokenomy.gateway.stores.pg_ledger import PgLedger
from tokenomy.gateway.stores.pg_tenancy import TENANT_SNAPSHOT, PgTenantStore, pg_engine, seeding_lock
from tokenomy.gateway.stores.redis_state import RedisState, SpendLedger
from tokenomy.gateway.stores.redis_store import redis_client
from tokenomy.gateway.stores.reservations import InProcessReservations
from tokenomy.gateway.stores.shared_config import SharedStoresConfig
from tokenomy.gateway.stores.tenancy_sql import TenantStore


@dataclass
class FleetParts:
    guard: OpsGuard
    ledger: PgLedger
    redis: Redis
    owner: str = field(default_factory=lambda: secrets.token_hex(8))  # this replica, in shared state

    async def start(self) -> None:
        await self.ledger.start()
        await self.guard.start()

    async def aclose(self) -> None:
        await self.guard.aclose()
        await self.redis.aclose()
        await self.ledger.aclose()


def shared_config(config: GatewayConfigLike) -> SharedStoresConfig | None:
    """``ops.shared`` when the config has one (a fleet replica), else None (embedded stores)."""
    ops = ops_config(config)
    return ops.shared


class FleetLedger(SpendLedger, LedgerHealth, Protocol):
    """What a replica's guard reads of the ledger (``PgLedger``): spend, costs, its health."""


def replica_guard(config: GatewayConfigLike, store: TenantStore, redis: Redis, ledger: FleetLedger,
                  shared: SharedStoresConfig, *, clock: Callable[[], float] = time.time,
                  metrics: OpsMetrics | None = None, prefix: str = "tk:") -> OpsGuard:
    """A replica's ``OpsGuard`` over ``RedisState``; ``prefix`` starts every Redis key (tests)."""
    ops = ops_config(config)
    state = RedisState(redis, shared, ops.breaker, ledger, lambda: store.tree, prefix=prefix)
    outage = OutagePolicy(shared.on_outage, LocalState(InProcessReservations(), ops.breaker), ledger)
    return OpsGuard(ops, store, state, config.price, clock=clock, metrics=metrics, outage=outage,
                    heartbeat_s=shared.heartbeat_period_s)


def build_fleet(config: GatewayConfigLike, shared: SharedStoresConfig, *, registry: Any = None,
                clock: Callable[[], float] = time.time) -> FleetParts:
    ops = ops_config(config)
    if not ops.server_secret:
        raise ValueError("ops.server_secret: a fleet needs one secret shared by every replica")
    engine = pg_engine(shared.postgres_url)
    try:
        # PostgreSQL away: the tree from this disk's snapshot (written by an earlier start), if any
        store = PgTenantStore(engine, ops.server_secret.encode(), refresh_s=shared.tenants_refresh_s,
                              snapshot=Path(shared.outbox_dir) / TENANT_SNAPSHOT)
        if not store.offline:
            with seeding_lock(engine):  # one replica at a time: tenants, the ledger's table and indexes
                store.reload()
                apply_seeds(store, ops.tenants)
                usage_events.metadata.create_all(engine, tables=[usage_events])
                with engine.begin() as conn:
                    conn.execute(sa.text("CREATE INDEX IF NOT EXISTS ix_usage_ts ON usage_events (ts_s)"))
    except sa.exc.OperationalError as e:  # a replica cannot authenticate anyone without the tenant tree
        engine.dispose()
        why = str(e.orig or e).strip().splitlines()[0]
        raise ValueError(f"ops.shared.postgres_url: PostgreSQL did not answer at start-up ({why}) and "
                         f"{shared.outbox_dir!r} holds no tenant snapshot ({TENANT_SNAPSHOT}, written by a "
                         "replica that started with PostgreSQL): a replica needs one to authenticate (a "
                         "ledger outbox left there drains once the replica starts)") from None
    ledger: PgLedger
    if shared.on_outage.ledger == "outbox":  # PostgreSQL away: events wait in this replica's outbox
        outbox = open_outbox(None, shared.outbox_dir)
        ledger = OutboxLedger(shared.postgres_url, outbox, pool_size=shared.postgres_pool_size,
                              record_timeout_s=shared.on_outage.ledger_timeout_s)
        if registry is not None:
            registry.register(OutboxCollector(outbox))
    else:
        ledger = PgLedger(shared.postgres_url, pool_size=shared.postgres_pool_size)
    ledger.sync_engine = engine
    redis = redis_client(shared)
    guard = replica_guard(config, store, redis, ledger, shared, clock=clock,
                        metrics=OpsMetrics(registry) if registry is not None else None)
    return FleetParts(guard, ledger, redis)
