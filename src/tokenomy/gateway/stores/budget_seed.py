"""Spend per node and period rebuilt from the ledger, for the in-process reservation store.

The ledger (``tokenomy.gateway.stores.ledger_sql.usage_events``) is durable before a client sees its request
complete, so after a crash or restart the in-process store starts from exactly what the ledger
holds: each key's cost since the start of the current day and month (UTC, by the event's finish
time), added to every node on its path in that node's budget period. Holds die with the process,
so none is left. One process per database: several gateways sharing budgets need the SQL store
(one file) or a fleet's Redis (``redis_state.RedisState``, seeded from the ledger the same way).
"""

from __future__ import annotations

import calendar
import time
from collections import defaultdict

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tokenomy.gateway.ops.budget import period_key
from tokenomy.gateway.ops.tenancy import NodeKind, TenantTree
from tokenomy.gateway.stores.reservations import Charge, InProcessReservations


def period_starts_s(now_s: float) -> dict[str, float]:
    t = time.gmtime(now_s)
    return {"day": now_s - now_s % 86400.0, "month": float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))}


def ledger_spend_by_key(engine: Engine, since_s: float) -> dict[str, float]:
    """Each key's recorded cost since ``since_s`` (no ledger table yet: nothing)."""
    from tokenomy.gateway.stores.ledger_sql import usage_events

    if not sa.inspect(engine).has_table(usage_events.name):
        return {}
    c = usage_events.c
    with engine.connect() as conn:
        rows = conn.execute(sa.select(c.key_id, sa.func.sum(c.cost_usd)).where(c.ts_s >= since_s)
                            .group_by(c.key_id)).all()
    return {str(k): float(v or 0.0) for k, v in rows}


def spend_by_charge(tree: TenantTree, by_period: dict[str, dict[str, float]], now_s: float) -> dict[Charge, float]:
    """Each node's spend in its current period, from each key's spend per period kind
    (``by_period[period][key_id]``): a node's is the sum of its keys'."""
    totals: dict[Charge, float] = defaultdict(float)
    for key in tree.nodes():
        if key.kind is not NodeKind.KEY:
            continue
        for node_id in tree.path(key.id):
            period = tree.get(node_id).limits.budget_period
            totals[(node_id, period_key(period, now_s))] += by_period[period].get(key.id, 0.0)
    return totals


def seed_from_ledger(store: InProcessReservations, tree: TenantTree, engine: Engine, now_s: float) -> int:
    """Set ``store``'s spend for the current periods from the ledger; returns the charges seeded."""
    by_period = {p: ledger_spend_by_key(engine, s) for p, s in period_starts_s(now_s).items()}
    totals = {c: usd for c, usd in spend_by_charge(tree, by_period, now_s).items() if usd}
    for charge, usd in totals.items():
        store.seed_spent(charge, usd)
    return len(totals)
