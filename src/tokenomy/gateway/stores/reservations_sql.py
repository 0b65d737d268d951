"""``Reservations`` persisted in SQL (SQLite by default), recoverable after a crash.

Atomicity: ``reserve`` runs one ``BEGIN IMMEDIATE`` transaction (SQLite's write lock, which
serialises reservers in other processes too) of conditional upserts
``reserved += amount WHERE spent + reserved + amount <= budget``; if any of them changes no row the
transaction rolls back, so either every node is charged or none is. Within one process calls are
synchronous (no await inside), so asyncio tasks cannot interleave them. The same statements are
valid PostgreSQL (``ON CONFLICT ... DO UPDATE ... WHERE``, ``DELETE ... RETURNING``).

Recovery: every hold is a row with its owner (the process that took it) and an expiry.
``reconcile`` settles or releases holds of other owners (a crashed gateway) and expired ones: a hold
whose request reached the ledger is settled at the ledger's cost, any other is released.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tokenomy.gateway.stores.reservations import Charge, Hold, Refusal
from tokenomy.gateway.stores.tenancy_sql import METADATA, direct_connection

USAGE = sa.Table(
    "tk_budget_usage", METADATA,
    sa.Column("node_id", sa.String(40), primary_key=True),
    sa.Column("period", sa.String(10), primary_key=True),
    sa.Column("spent_usd", sa.Float, nullable=False, default=0.0),
    sa.Column("reserved_usd", sa.Float, nullable=False, default=0.0),
)

HOLDS = sa.Table(
    "tk_holds", METADATA,
    sa.Column("request_id", sa.String(200), primary_key=True),
    sa.Column("charges_json", sa.Text, nullable=False),
    sa.Column("amount_usd", sa.Float, nullable=False),
    sa.Column("owner", sa.String(32), nullable=False),
    sa.Column("expires_at_s", sa.Float, nullable=False),
)

_EPS = 1e-12


class SqlReservations:
    """``Reservations`` in the engine's SQLite file; ``owner`` identifies this process's holds."""

    def __init__(self, engine: Engine, owner: str | None = None) -> None:
        self.engine = engine
        self.owner = owner or secrets.token_hex(8)
        METADATA.create_all(engine)
        self._db = direct_connection(engine)
        self._cache: dict[Charge, tuple[float, float]] = {}  # last (spent, reserved) this process saw

    def reserve(self, hold: Hold, budgets_usd: Mapping[Charge, float]) -> Refusal | None:
        db = self._db
        amount = hold.amount_usd
        seen: dict[Charge, tuple[float, float]] = {}
        db.execute("BEGIN IMMEDIATE")
        try:
            cur = db.execute("INSERT OR IGNORE INTO tk_holds (request_id, charges_json, amount_usd, owner, "
                             "expires_at_s) VALUES (?, ?, ?, ?, ?)",
                             (hold.request_id, json.dumps(hold.charges), amount, self.owner, hold.expires_at_s))
            if cur.rowcount == 0:  # this request already holds its reservation
                db.execute("COMMIT")
                return None
            free = [c for c in hold.charges if c not in budgets_usd]
            for charge in hold.charges:
                budget = budgets_usd.get(charge)
                if budget is None:
                    continue
                row = None
                if amount <= budget + _EPS:  # else it does not fit even an untouched budget
                    row = db.execute(
                        "INSERT INTO tk_budget_usage (node_id, period, spent_usd, reserved_usd) VALUES (?, ?, 0, ?) "
                        "ON CONFLICT (node_id, period) DO UPDATE SET reserved_usd = reserved_usd + "
                        "excluded.reserved_usd WHERE spent_usd + reserved_usd + excluded.reserved_usd <= ? "
                        "RETURNING spent_usd, reserved_usd", (charge[0], charge[1], amount, budget + _EPS)).fetchone()
                if row is None:
                    spent, reserved = self._read(charge)
                    db.execute("ROLLBACK")
                    return Refusal(charge, budget, spent, reserved)
                seen[charge] = (float(row[0]), float(row[1]))
            if free:  # nodes without a budget: counted in one statement, never refused
                values = ", ".join("(?, ?, 0, ?)" for _ in free)
                params = [x for c in free for x in (c[0], c[1], amount)]
                for node_id, period, spent, reserved in db.execute(
                        f"INSERT INTO tk_budget_usage (node_id, period, spent_usd, reserved_usd) VALUES {values} "
                        "ON CONFLICT (node_id, period) DO UPDATE SET reserved_usd = reserved_usd + "
                        "excluded.reserved_usd RETURNING node_id, period, spent_usd, reserved_usd", params).fetchall():
                    seen[(node_id, period)] = (float(spent), float(reserved))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._cache.update(seen)
        return None

    def _finish(self, request_id: str, actual_usd: float | None) -> Hold | None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("DELETE FROM tk_holds WHERE request_id = ? "
                             "RETURNING request_id, charges_json, amount_usd, expires_at_s", (request_id,)).fetchone()
            if row is None:
                db.execute("COMMIT")
                return None
            hold = _hold(row)
            keys = ", ".join("(?, ?)" for _ in hold.charges)
            rows = db.execute(
                "UPDATE tk_budget_usage SET reserved_usd = max(0.0, reserved_usd - ?), spent_usd = spent_usd + ? "
                f"WHERE (node_id, period) IN (VALUES {keys}) RETURNING node_id, period, spent_usd, reserved_usd",
                [hold.amount_usd, actual_usd or 0.0, *(x for c in hold.charges for x in c)]).fetchall()
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        for node_id, period, spent, reserved in rows:
            self._cache[(node_id, period)] = (float(spent), float(reserved))
        return hold

    def settle(self, request_id: str, actual_usd: float) -> Hold | None:
        return self._finish(request_id, actual_usd)

    def release(self, request_id: str) -> Hold | None:
        return self._finish(request_id, None)

    def _read(self, charge: Charge) -> tuple[float, float]:
        row = self._db.execute("SELECT spent_usd, reserved_usd FROM tk_budget_usage WHERE node_id = ? AND period = ?",
                               charge).fetchone()
        return (0.0, 0.0) if row is None else (float(row[0]), float(row[1]))

    def usage(self, charge: Charge) -> tuple[float, float]:
        """From this process's last write to that row (exact with one gateway process; another
        process's changes show once this one writes the row again), else read."""
        cached = self._cache.get(charge)
        if cached is None:
            cached = self._cache[charge] = self._read(charge)
        return cached

    def holds(self) -> list[Hold]:
        rows = self._db.execute("SELECT request_id, charges_json, amount_usd, expires_at_s FROM tk_holds").fetchall()
        return [_hold(r) for r in rows]

    def reconcile(self, now_s: float, ledger_cost_usd: Callable[[str], float | None]) -> dict[str, int]:
        """Finish holds left by another owner (a crashed process) or past their expiry.

        ``ledger_cost_usd(request_id)`` is the cost the ledger recorded for that request, or None
        when the request never completed. Returns ``{"settled": n, "released": m}``.
        """
        rows = self._db.execute("SELECT request_id FROM tk_holds WHERE owner != ? OR expires_at_s <= ?",
                                (self.owner, now_s)).fetchall()
        counts = {"settled": 0, "released": 0}
        for (request_id,) in rows:
            cost = ledger_cost_usd(request_id)
            if cost is None:
                counts["released"] += self.release(request_id) is not None
            else:
                counts["settled"] += self.settle(request_id, cost) is not None
        return counts


def _hold(row: tuple[str, str, float, float]) -> Hold:
    charges = tuple((str(n), str(p)) for n, p in json.loads(row[1]))
    return Hold(row[0], charges, float(row[2]), float(row[3]))
