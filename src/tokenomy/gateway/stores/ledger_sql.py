"""The embedded ledger: :class:`SqlLedger`, the :class:`tokenomy.gateway.metering.ledger.Ledger` on
SQLAlchemy Core (SQLite in WAL mode by default); ``usage_events`` is its table.

Latency: writes are group-committed. ``record`` queues the event and awaits the commit of the
group that holds it, so an event is acknowledged only once it is durable, yet concurrent requests
share one commit instead of paying one each. A failed commit fails every request in its group;
nothing is dropped silently. Two writers keep that contract:

* ``inline`` (SQLite's default): the group is every event recorded in one turn of the event loop,
  committed by a callback on the loop itself through one raw DBAPI connection. A WAL commit at
  ``synchronous=NORMAL`` is a write(2) without fsync (~0.1 ms), cheaper than waking a thread
  and trading the GIL with it (measured: 0.5 ms idle, several ms under load).
* ``thread``: one writer thread owns a connection and commits whatever has queued while the
  previous commit ran. For ``synchronous=FULL`` (an fsync a commit) and for network databases,
  where a commit must not stall the loop.

Checkpoints (copying the WAL into the database file, with an fsync of each at ``NORMAL``) stay
off the event loop: a ``ledger-checkpoint`` thread runs a passive checkpoint every
``_CHECKPOINT_S`` seconds, which neither blocks nor is blocked by the writer (SQLite releases the
GIL while it copies); the inline writer's own automatic checkpoint starts only at
``_FALLBACK_CHECKPOINT_PAGES``, should that thread fall behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import queue
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import MISSING, asdict, fields
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from tokenomy.gateway.metering.ledger import UsageEvent, UsageFilter
from tokenomy.gateway.metering.meter import SessionState

log = logging.getLogger(__name__)


_FIELDS = tuple(f.name for f in fields(UsageEvent))
_metadata = sa.MetaData()
_TYPES: dict[str, Any] = {"str": sa.String, "float": sa.Float, "int": sa.Integer, "bool": sa.Boolean}


def _column(name: str, type_name: str) -> sa.Column[Any]:
    nullable = "None" in type_name
    base = type_name.replace(" | None", "")
    return sa.Column(name, _TYPES[base](), primary_key=name == "request_id", nullable=nullable)


usage_events = sa.Table(
    "usage_events",
    _metadata,
    *(_column(f.name, str(f.type)) for f in fields(UsageEvent)),
    sa.Index("ix_usage_session", "key_id", "session_id", "turn"),
    sa.Index("ix_usage_tenant_ts", "tenant_path", "ts_s"),
)


def add_missing_columns(conn: sa.Connection) -> list[str]:
    """Columns of ``usage_events`` that an older ledger's table lacks, added (nullable, with the
    field's default for existing rows): a ledger file outlives gateway versions."""
    have = {c["name"] for c in sa.inspect(conn).get_columns("usage_events")}
    added: list[str] = []
    for f in fields(UsageEvent):
        if f.name in have:
            continue
        col = usage_events.c[f.name]
        default = f.default if f.default is not MISSING else None
        ddl = f"ALTER TABLE usage_events ADD COLUMN {f.name} {col.type.compile(conn.dialect)}"
        if default is not None:
            ddl += f" DEFAULT {default!r}" if isinstance(default, str) else f" DEFAULT {default}"
        conn.execute(sa.text(ddl))
        added.append(f.name)
    if added:
        log.info("ledger: added columns %s to usage_events", ", ".join(added))
    return added


def make_engine(url: str, synchronous: str = "NORMAL") -> sa.Engine:
    is_sqlite = url.startswith("sqlite")
    engine = sa.create_engine(url, connect_args={"check_same_thread": False} if is_sqlite else {})
    if engine.dialect.name == "sqlite":

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={synchronous}")
            cur.execute("PRAGMA busy_timeout=5000")
            cur.close()

    return engine


_Item = tuple[UsageEvent, asyncio.AbstractEventLoop, "asyncio.Future[None]"]


_ROW = operator.attrgetter(*_FIELDS)
_SQLITE_INSERT = (
    f"INSERT OR IGNORE INTO usage_events ({', '.join(_FIELDS)}) VALUES ({', '.join('?' * len(_FIELDS))})"
)


_CHECKPOINT_S = 0.5
_FALLBACK_CHECKPOINT_PAGES = 20_000  # SQLite's default is 1000 (4 MB of WAL at 4 KB pages)


class _Checkpointer:
    """A daemon thread that checkpoints an SQLite file's WAL every ``period_s`` until stopped."""

    def __init__(self, path: str, period_s: float = _CHECKPOINT_S) -> None:
        self._path = path
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout=5000")
            while not self._stop.wait(self._period_s):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    log.exception("ledger: checkpoint failed (the WAL grows until one succeeds)")
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def usage_select(flt: UsageFilter) -> sa.Select[Any]:
    """The ledger rows a usage query asks for (SQLite and PostgreSQL alike), oldest first."""
    t = usage_events.c
    stmt = sa.select(usage_events)
    if flt.tenant_prefix:
        p = flt.tenant_prefix.strip("/")
        stmt = stmt.where(sa.or_(t.tenant_path == p, t.tenant_path.startswith(p + "/", autoescape=True)))
    for col, val in ((t.key_id, flt.key_id), (t.model, flt.model), (t.session_id, flt.session_id)):
        if val is not None:
            stmt = stmt.where(col == val)
    if flt.since_s is not None:
        stmt = stmt.where(t.ts_s >= flt.since_s)
    if flt.until_s is not None:
        stmt = stmt.where(t.ts_s < flt.until_s)
    stmt = stmt.order_by(t.ts_s, t.request_id).limit(flt.limit)
    return stmt


class SqlLedger:
    """SQLAlchemy ledger with group commit (see the module docstring for the two writers)."""

    def __init__(self, url: str, synchronous: str = "NORMAL", max_batch: int = 256, writer: str = "auto") -> None:
        self.engine = make_engine(url, synchronous)
        _metadata.create_all(self.engine)
        with self.engine.begin() as conn:
            add_missing_columns(conn)
        self.max_batch = max_batch
        dialect = self.engine.dialect.name
        ins: Any = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}.get(dialect)
        if ins is None:
            raise ValueError(f"ledger: unsupported database {dialect!r} (sqlite or postgresql)")
        if writer == "auto":
            writer = "inline" if dialect == "sqlite" else "thread"
        if writer not in ("inline", "thread") or (writer == "inline" and dialect != "sqlite"):
            raise ValueError(f"ledger.writer: {writer!r} is not available for {dialect}")
        self.writer = writer
        self._insert = ins(usage_events).on_conflict_do_nothing(index_elements=["request_id"])
        self._closed = False
        self._pending: list[tuple[UsageEvent, asyncio.Future[None]]] = []
        self._flush_scheduled = False
        self._raw: Any = None  # the inline writer's DBAPI connection
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._checkpointer: _Checkpointer | None = None
        db_file = self.engine.url.database
        if writer == "inline" and db_file and db_file != ":memory:":
            self._checkpointer = _Checkpointer(db_file)
        if writer == "thread":
            self._writer = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
            self._writer.start()

    async def record(self, event: UsageEvent, alone: bool = False) -> None:
        if self._closed:
            raise RuntimeError("ledger is closed")
        if alone and self._writer is None and not self._pending:
            self._commit_inline([event])  # durable on return, without a future and two loop turns
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if self._writer is not None:
            self._queue.put((event, loop, fut))
        else:
            self._pending.append((event, fut))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush_inline)
        await fut

    def _flush_inline(self) -> None:
        """Commit every event recorded since the last flush, in one transaction, then wake their waiters."""
        self._flush_scheduled = False
        batch, self._pending = self._pending, []
        error: BaseException | None = None
        try:
            self._commit_inline([ev for ev, _ in batch])
        except Exception as exc:
            error = exc
        for _, fut in batch:
            if fut.done():
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(RuntimeError(f"ledger write failed: {error}"))

    def _commit_inline(self, events: list[UsageEvent]) -> None:
        """Insert ``events`` in one transaction on the loop's connection; raises when it failed."""
        try:
            if self._raw is None:
                self._raw = self._inline_connection()
            cur = self._raw.cursor()
            if len(events) == 1:
                cur.execute(_SQLITE_INSERT, _ROW(events[0]))
            else:
                cur.executemany(_SQLITE_INSERT, [_ROW(ev) for ev in events])
            self._raw.commit()
        except Exception:
            log.exception("ledger: commit of %d events failed", len(events))
            if self._raw is not None:
                with contextlib.suppress(Exception):
                    self._raw.rollback()
            raise

    def _inline_connection(self) -> Any:
        raw = self.engine.raw_connection()
        if self._checkpointer is not None:  # the checkpoint thread does it, off the event loop
            cur = raw.cursor()
            cur.execute(f"PRAGMA wal_autocheckpoint={_FALLBACK_CHECKPOINT_PAGES}")
            cur.close()
        return raw

    def record_sync(self, events: Sequence[UsageEvent]) -> None:
        """Write ``events`` now, from a thread that is not the writer (tests, imports)."""
        with self.engine.begin() as conn:
            conn.execute(self._insert, [asdict(e) for e in events])

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            error: BaseException | None = None
            try:
                with self.engine.begin() as conn:
                    conn.execute(self._insert, [asdict(ev) for ev, _, _ in batch])
            except Exception as exc:  # every waiter learns; nothing dropped silently
                log.exception("ledger: commit of %d events failed", len(batch))
                error = exc
            self._resolve(batch, error)
            if stop:
                return

    @staticmethod
    def _resolve(batch: list[_Item], error: BaseException | None) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for _, loop, fut in batch:
            by_loop.setdefault(loop, []).append(fut)

        def done(futs: list[asyncio.Future[None]]) -> None:
            for f in futs:
                if f.done():
                    continue
                if error is None:
                    f.set_result(None)
                else:
                    f.set_exception(RuntimeError(f"ledger write failed: {error}"))

        for loop, futs in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
                loop.call_soon_threadsafe(done, futs)

    async def session_state(self, key_id: str, session_id: str) -> SessionState | None:
        return await asyncio.to_thread(self._session_state, key_id, session_id)

    async def exists(self, request_id: str) -> bool:
        if self._writer is None:  # inline: a primary-key lookup on the loop's own connection (~20 us)
            if self._raw is None:
                self._raw = self._inline_connection()
            cur = self._raw.cursor()
            cur.execute("SELECT 1 FROM usage_events WHERE request_id = ?", (request_id,))
            return cur.fetchone() is not None
        return await asyncio.to_thread(self.cost_usd, request_id) is not None

    def _session_state(self, key_id: str, session_id: str) -> SessionState | None:
        t = usage_events.c
        stmt = (
            sa.select(t.turn, t.prompt_tokens, t.output_tokens)
            .where(t.key_id == key_id, t.session_id == session_id, t.outcome == "ok")
            .order_by(t.turn.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else SessionState(int(row[0]), int(row[1]), int(row[2]))

    def cost_usd(self, request_id: str) -> float | None:
        t = usage_events.c
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.cost_usd).where(t.request_id == request_id)).first()
        return None if row is None else float(row[0])

    def query(self, flt: UsageFilter) -> list[UsageEvent]:
        with self.engine.connect() as conn:
            return [UsageEvent(**dict(zip(_FIELDS, row, strict=True))) for row in conn.execute(usage_select(flt))]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=10)
        if self._checkpointer is not None:
            self._checkpointer.stop()
        if self._raw is not None:
            self._raw.close()
        self.engine.dispose()
