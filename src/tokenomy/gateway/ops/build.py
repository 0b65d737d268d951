"""Build the embedded gateway's Guard: tenants and (optionally) holds in SQLite, the rest in process.

A fleet replica's Guard is the same ``OpsGuard`` over ``RedisState``: ``ops.fleet.build_fleet``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine

from tokenomy.gateway.ops.alerts import Alerter
from tokenomy.gateway.ops.config import GatewayConfigLike, ops_config, secret_of
from tokenomy.gateway.ops.metrics import OpsMetrics
from tokenomy.gateway.ops.ops_guard import OpsGuard
from tokenomy.gateway.ops.tenancy_seed import apply_seeds
from tokenomy.gateway.stores.budget_seed import seed_from_ledger
from tokenomy.gateway.stores.local_state import LocalState
from tokenomy.gateway.stores.reservations import InProcessReservations, Reservations
from tokenomy.gateway.stores.reservations_sql import SqlReservations
from tokenomy.gateway.stores.tenancy_sql import TenantStore, sqlite_engine


def build_guard(config: GatewayConfigLike, *, engine: Engine | None = None, db_url: str | None = None,
                registry: Any = None, clock: Callable[[], float] = time.time,
                ledger_cost_usd: Callable[[str], float | None] | None = None,
                alerter: Alerter | None = None) -> OpsGuard:
    """The gateway's Guard from its config: ``config.ops`` (an ``OpsConfig`` mapping) and
    ``config.price(model)``.

    The database is ``engine``, else ``ops.db_url``, else ``db_url`` (the ledger's). Holds left by
    a previous process are reconciled at once: settled at the cost ``ledger_cost_usd(request_id)``
    reports, released when it reports None (or when no lookup is given).
    """
    ops = ops_config(config)
    if engine is None:
        url = ops.db_url or db_url
        if url is None:
            raise ValueError("ops.db_url: no database for tenants (and no ledger URL to share)")
        engine = sqlite_engine(url)
    store = TenantStore(engine, server_secret=secret_of(ops, engine), refresh_interval_s=ops.tenant_refresh_s,
                        clock=clock)
    apply_seeds(store, ops.tenants)
    reservations: Reservations
    if ops.reservations == "sql":
        sql = SqlReservations(engine)
        sql.reconcile(clock(), ledger_cost_usd or (lambda _rid: None))
        reservations = sql
    else:
        memory = InProcessReservations()
        ledger_url = db_url or ops.db_url
        seed_from_ledger(memory, store.tree, sqlite_engine(ledger_url) if ledger_url else engine, clock())
        reservations = memory
    return OpsGuard(ops, store, LocalState(reservations, ops.breaker), config.price, clock=clock,
                    metrics=OpsMetrics(registry) if registry is not None else None, alerter=alerter)
