"""The usage ledger in PostgreSQL (SQLAlchemy async, asyncpg): one ledger for every gateway replica.

Same contract as the embedded ``SqlLedger``: one event per request id (``INSERT ... ON CONFLICT
(request_id) DO NOTHING``, so a retried write never counts twice), durable before the client sees
completion (``record`` returns once the transaction holding the event has committed), and writes
are group-committed: events recorded while a commit is in flight go together in the next one, so
concurrent requests share one round trip. A failed commit fails every request of its group;
nothing is dropped silently.

Spend is rebuilt from here at start-up (``spend_by_key``) for the budget store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import time
from dataclasses import fields
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.metering.ledger import UsageEvent, UsageFilter
from tokenomy.gateway.metering.meter import SessionState
from tokenomy.gateway.stores.ledger_sql import add_missing_columns, usage_events, usage_select

log = logging.getLogger(__name__)
_DOWN = (OSError, sa.exc.DBAPIError, sa.exc.TimeoutError, asyncio.TimeoutError)  # PostgreSQL away or too slow
_FIELDS = tuple(f.name for f in fields(UsageEvent))
_ROW = operator.attrgetter(*_FIELDS)
_PG_TYPES = {"str": "text", "float": "float8", "int": "int4", "bool": "bool"}
# Events in one statement, so one round trip: the insert a CTE (it runs even though nothing reads
# it), the answer the id of the transaction that committed it. One event binds its 27 values; a
# group binds each column as an array (asyncpg checks every array parameter's type in Python, a
# cost one event need not pay).
_INSERT_ONE_SQL = (f"WITH ins AS (INSERT INTO usage_events ({', '.join(_FIELDS)}) VALUES "
                   f"({', '.join(f'${i + 1}' for i in range(len(_FIELDS)))}) ON CONFLICT (request_id) DO NOTHING) "
                   "SELECT pg_current_xact_id()::text")
_INSERT_MANY_SQL = (f"WITH ins AS (INSERT INTO usage_events ({', '.join(_FIELDS)}) SELECT * FROM unnest("
                    + ", ".join(f"${i + 1}::{_PG_TYPES[str(f.type).replace(' | None', '')]}[]"
                                for i, f in enumerate(fields(UsageEvent)))
                    + ") ON CONFLICT (request_id) DO NOTHING) SELECT pg_current_xact_id()::text")


def async_pg_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` URLs with the asyncpg driver."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix):]
    raise ValueError(f"not a PostgreSQL URL: {url!r}")


class PgLedger:
    """``Ledger`` on PostgreSQL. Create it inside the event loop that will use it, then ``await
    start()``; ``pool_size``: connections kept open (group commit needs one; reads use the rest)."""

    def __init__(self, url: str, pool_size: int = 5, max_batch: int = 512, timeout_s: float = 5.0) -> None:
        self.engine: AsyncEngine = create_async_engine(
            async_pg_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True,
            pool_timeout=timeout_s, connect_args={"timeout": timeout_s, "command_timeout": timeout_s})
        self.max_batch = max_batch
        self._pending: list[tuple[UsageEvent, asyncio.Future[None]]] = []
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task[None] | None = None
        self._dsn = "postgresql://" + async_pg_url(url).split("://", 1)[1]
        self._con: asyncpg.Connection | None = None  # the writer's
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sync_engine: sa.Engine | None = None  # for blocking readers (the console), when the owner sets one
        self.failed_at_s: float | None = None  # monotonic time of the last failed commit, None after a good one
        # request id -> the transaction id that committed its event, until ``pop_xid`` (the guard's
        # settle) takes it; bounded (a request recorded but never settled must not grow it forever)
        self._xids: dict[str, int] = {}

    async def start(self) -> PgLedger:
        """Create the table when missing and start the writer (idempotent)."""
        if self._writer is not None:
            return self
        await self.create_table()
        self.start_writer()
        return self

    async def create_table(self) -> None:
        async with self.engine.begin() as conn:  # replicas starting together: one creates, the others wait
            await conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('tokenomy ledger ddl'))"))
            await conn.run_sync(usage_events.metadata.create_all, tables=[usage_events])
            await conn.run_sync(add_missing_columns)

    def start_writer(self) -> None:
        """Start the group-commit writer (inside the running loop); the table must exist."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._writer = self._loop.create_task(self._run(), name="pg-ledger-writer")

    async def record(self, event: UsageEvent, alone: bool = False) -> None:
        """Store ``event`` durably (returns after its commit); a second event with the same id is ignored."""
        if self._wake is None:
            raise RuntimeError("PgLedger.start() was not awaited")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((event, fut))
        self._wake.set()
        await fut

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
                error: BaseException | None = None
                try:
                    xid = await self._commit([e for e, _ in batch])
                except asyncio.CancelledError:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(RuntimeError("ledger closed before the event was committed"))
                    raise
                except Exception as exc:  # every request of the group learns its event is not stored
                    log.warning("ledger commit of %d events failed: %s", len(batch), exc)
                    error = exc
                    self.failed_at_s = time.monotonic()
                else:
                    self.failed_at_s = None
                    if len(self._xids) > 100_000:
                        self._xids.clear()
                    for ev, _ in batch:
                        self._xids[ev.request_id] = xid
                for _, fut in batch:
                    if not fut.done():
                        if error is None:
                            fut.set_result(None)
                        else:
                            fut.set_exception(error)

    async def _commit(self, events: list[UsageEvent]) -> int:
        """Insert ``events`` in one statement (its own transaction: one round trip) on the writer's
        own asyncpg connection (the hot path: SQLAlchemy's statement layer would cost more CPU than
        the database); the id of the transaction that committed them."""
        con = self._con
        if con is None or con.is_closed():
            con = self._con = await asyncpg.connect(self._dsn, timeout=self.timeout_s,
                                                    command_timeout=self.timeout_s)
        if len(events) == 1:
            return int(await con.fetchval(_INSERT_ONE_SQL, *_ROW(events[0])))
        return int(await con.fetchval(_INSERT_MANY_SQL, *zip(*map(_ROW, events), strict=True)))

    async def session_state(self, key_id: str, session_id: str) -> SessionState | None:
        t = usage_events.c
        stmt = (sa.select(t.turn, t.prompt_tokens, t.output_tokens)
                .where(t.key_id == key_id, t.session_id == session_id, t.outcome == "ok")
                .order_by(t.turn.desc()).limit(1))
        try:
            async with self.engine.connect() as conn:
                row = (await conn.execute(stmt)).first()
        except _DOWN as e:
            raise self._unavailable(e) from None
        return None if row is None else SessionState(int(row[0]), int(row[1]), int(row[2]))

    async def exists(self, request_id: str) -> bool:
        try:
            return await self.cost(request_id) is not None
        except _DOWN as e:
            raise self._unavailable(e) from None

    def _unavailable(self, e: BaseException) -> GatewayError:
        """What a request that needs the ledger gets while PostgreSQL is away (503, never a 500)."""
        log.warning("ledger unavailable: %s", e)
        self.failed_at_s = time.monotonic()
        return GatewayError(503, "the usage ledger is unavailable; retry shortly", type="server_error",
                            code="ledger_unavailable", headers={"retry-after": "2"})

    async def cost(self, request_id: str) -> float | None:
        """The recorded cost of ``request_id``, None when it has no event."""
        t = usage_events.c
        async with self.engine.connect() as conn:
            row = (await conn.execute(sa.select(t.cost_usd).where(t.request_id == request_id))).first()
        return None if row is None else float(row[0])

    def pop_xid(self, request_id: str) -> int | None:
        """The ledger transaction that committed ``request_id``'s event (once), None if unknown."""
        return self._xids.pop(request_id, None)

    async def spend_snapshot(self, since_s: dict[str, float]) -> tuple[dict[str, dict[str, float]], str]:
        """Each key's cost since each ``since_s[period]``, and the snapshot (``xmin:xmax:xip,...``)
        the sums were read in, in one repeatable-read transaction."""
        c = usage_events.c
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                snapshot = str((await conn.execute(sa.text("SELECT pg_current_snapshot()::text"))).scalar_one())
                out: dict[str, dict[str, float]] = {}
                for period, since in since_s.items():
                    rows = (await conn.execute(sa.select(c.key_id, sa.func.sum(c.cost_usd))
                                               .where(c.ts_s >= since).group_by(c.key_id))).all()
                    out[period] = {str(k): float(v or 0.0) for k, v in rows}
        return out, snapshot

    async def spend_by_key(self, since_s: float) -> dict[str, float]:
        """Each key's recorded cost since ``since_s`` (seeding the budget store)."""
        c = usage_events.c
        async with self.engine.connect() as conn:
            rows = (await conn.execute(sa.select(c.key_id, sa.func.sum(c.cost_usd)).where(c.ts_s >= since_s)
                                       .group_by(c.key_id))).all()
        return {str(k): float(v or 0.0) for k, v in rows}

    async def fetch(self, flt: UsageFilter) -> list[UsageEvent]:
        stmt = usage_select(flt)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return [UsageEvent(**dict(zip(_FIELDS, row, strict=True))) for row in rows]

    # --- the blocking part of the ``Ledger`` contract (called from worker threads) ----------------

    def _blocking(self, coro: Any) -> Any:
        if self._loop is None:
            raise RuntimeError("PgLedger.start() was not awaited")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    def query(self, flt: UsageFilter) -> list[UsageEvent]:
        """``fetch`` for a worker thread (``GET /v1/usage`` runs ``ledger.query`` in one)."""
        return list(self._blocking(self.fetch(flt)))

    def cost_usd(self, request_id: str) -> float | None:
        """``cost`` for a worker thread."""
        cost: float | None = self._blocking(self.cost(request_id))
        return cost

    def close(self) -> None:
        """Closing needs the event loop: ``aclose`` does it (the app's shutdown awaits it)."""

    async def aclose(self) -> None:
        if self._writer is not None:
            for _ in range(1000):  # let queued events commit or fail first (bounded: 10 s)
                if not self._pending:
                    break
                await asyncio.sleep(0.01)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._con is not None:
            with contextlib.suppress(Exception):
                await self._con.close(timeout=5)
            self._con = None
        await self.engine.dispose()
