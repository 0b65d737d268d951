"""Build one gateway replica of a fleet: the ledger and tenants on PostgreSQL, token operations'
state in Redis (``ops.shared`` in the gateway config; docs/gateway-ops.md, "Running a fleet").

``build_fleet`` is synchronous (the app is built before its event loop runs); ``FleetParts.start``
and ``aclose`` run in the app's lifespan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from tokenomy.gateway.ops.config import GatewayConfigLike, ops_config
from tokenomy.gateway.ops.fleet_guard import FleetGuard, redis_client
from tokenomy.gateway.ops.metrics import OpsMetrics
from tokenomy.gateway.ops.tenancy_seed import apply_seeds
from tokenomy.gateway.stores.ledger_sql import usage_events
from tokenomy.gateway.stores.pg_ledger import PgLedger
from tokenomy.gateway.stores.pg_tenancy import PgTenantStore, pg_engine, seeding_lock
from tokenomy.gateway.stores.shared_config import SharedStoresConfig


@dataclass
class FleetParts:
    guard: FleetGuard
    ledger: PgLedger

    async def start(self) -> None:
        await self.ledger.start()
        await self.guard.start()

    async def aclose(self) -> None:
        await self.guard.aclose()
        await self.guard.redis.aclose()
        await self.ledger.aclose()


def shared_config(config: GatewayConfigLike) -> SharedStoresConfig | None:
    """``ops.shared`` when the config has one (a fleet replica), else None (embedded stores)."""
    ops = ops_config(config)
    return ops.shared


def build_fleet(config: GatewayConfigLike, shared: SharedStoresConfig, *, registry: Any = None,
                clock: Callable[[], float] = time.time) -> FleetParts:
    ops = ops_config(config)
    if not ops.server_secret:
        raise ValueError("ops.server_secret: a fleet needs one secret shared by every replica")
    engine = pg_engine(shared.postgres_url)
    store = PgTenantStore(engine, ops.server_secret.encode(), refresh_s=shared.tenants_refresh_s)
    with seeding_lock(engine):  # one replica at a time: tenants, the ledger's table and indexes
        store.reload()
        apply_seeds(store, ops.tenants)
        usage_events.metadata.create_all(engine, tables=[usage_events])
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE INDEX IF NOT EXISTS ix_usage_ts ON usage_events (ts_s)"))
    ledger = PgLedger(shared.postgres_url, pool_size=shared.postgres_pool_size)
    ledger.sync_engine = engine
    guard = FleetGuard(ops, store, config.price, redis_client(shared), ledger, shared, clock=clock,
                       metrics=OpsMetrics(registry) if registry is not None else None)
    return FleetParts(guard, ledger)
