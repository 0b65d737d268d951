"""A replica's durable local outbox for the ledger: usage events PostgreSQL could not take in time.

One SQLite file on the replica's own disk, in WAL mode at ``synchronous=FULL`` (a commit is an
fsync: an appended event survives a crash of the process or the machine). Appends are
group-committed like the ledger's thread writer: events appended while a commit is in flight go
together in the next one, on one writer thread that owns the connection. Rows are keyed by
request id (a second append of the same id is ignored) and ordered by an autoincrement ``seq``,
so the drainer (:class:`tokenomy.gateway.stores.outbox_ledger.OutboxLedger`) moves them oldest
first.

One file, one replica: the file is locked (``flock``) while open. The default name,
``tokenomy-outbox-<host>-<n>.db`` in ``ops.shared.outbox_dir`` (default: the working directory), takes the first ``n`` no live replica
holds, so a replica restarted from the same disk reopens (and drains) a dead replica's queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from tokenomy.gateway.metering.ledger import UsageEvent
from tokenomy.gateway.metering.meter import SessionState

log = logging.getLogger(__name__)

_SCHEMA = """CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL UNIQUE,
    key_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    queued_at_s REAL NOT NULL,
    event TEXT NOT NULL)"""
_INSERT = ("INSERT OR IGNORE INTO outbox (request_id, key_id, session_id, turn, outcome, queued_at_s, event) "
           "VALUES (?, ?, ?, ?, ?, ?, ?)")


class OutboxBusy(RuntimeError):
    """Another live process holds this outbox file."""


class Outbox:
    """The queue in one SQLite file (``path``), locked for this process until ``close``."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = open(self.path + ".lock", "a")  # noqa: SIM115 (held until close)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise OutboxBusy(f"ledger outbox {self.path} is held by another process") from None
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="ledger-outbox")  # owns the connection
        self._conn = sqlite3.connect(self.path, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        with self._conn:
            self._conn.execute(_SCHEMA)
        self.depth, self.oldest_at_s = self._stats()  # what is left from a previous run is drained first
        self._pending: list[tuple[UsageEvent, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    # --- the writer thread's side ------------------------------------------------------------

    def _stats(self) -> tuple[int, float | None]:
        n, oldest = self._conn.execute("SELECT count(*), min(queued_at_s) FROM outbox").fetchone()
        return int(n), None if oldest is None else float(oldest)

    def _write(self, events: list[UsageEvent]) -> tuple[int, float | None]:
        now = time.time()
        with self._conn:
            self._conn.executemany(_INSERT, [(e.request_id, e.key_id, e.session_id, e.turn, e.outcome, now,
                                              json.dumps(asdict(e))) for e in events])
        return self._stats()

    def _delete(self, seqs: list[int]) -> tuple[int, float | None]:
        with self._conn:
            self._conn.executemany("DELETE FROM outbox WHERE seq = ?", [(s,) for s in seqs])
        return self._stats()

    def _fetch(self, sql: str, args: tuple[Any, ...]) -> list[tuple[int, UsageEvent]]:
        rows = self._conn.execute(sql, args).fetchall()
        return [(int(seq), UsageEvent(**json.loads(ev))) for seq, ev in rows]

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._exec, fn, *args)

    # --- the event loop's side ---------------------------------------------------------------

    @property
    def queued(self) -> int:
        """Events in the file plus those appended and not yet committed."""
        return self.depth + len(self._pending) + (self._flusher is not None)

    async def append(self, event: UsageEvent) -> None:
        """Store ``event`` durably (returns once its group's commit, an fsync, is done)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((event, fut))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush(), name="ledger-outbox-flush")
        await fut

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    self.depth, self.oldest_at_s = await self._run(self._write, [e for e, _ in batch])
                except Exception as exc:  # every request of the group learns its event is not stored
                    log.error("ledger outbox: commit of %d events failed: %s", len(batch), exc)
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                else:
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_result(None)
        finally:
            self._flusher = None

    async def oldest(self, n: int) -> list[tuple[int, UsageEvent]]:
        """The ``n`` oldest events with their ``seq``."""
        got: list[tuple[int, UsageEvent]] = await self._run(
            self._fetch, "SELECT seq, event FROM outbox ORDER BY seq LIMIT ?", (n,))
        return got

    async def delete(self, seqs: list[int]) -> None:
        """Forget the events ``seqs`` (once PostgreSQL holds them)."""
        self.depth, self.oldest_at_s = await self._run(self._delete, seqs)

    async def find(self, request_id: str) -> UsageEvent | None:
        got = await self._run(self._fetch, "SELECT seq, event FROM outbox WHERE request_id = ?", (request_id,))
        return got[0][1] if got else None

    async def session_state(self, key_id: str, session_id: str) -> SessionState | None:
        """The session's last ``ok`` turn queued here, None when it has none."""
        got = await self._run(self._fetch, "SELECT seq, event FROM outbox WHERE key_id = ? AND session_id = ? "
                              "AND outcome = 'ok' ORDER BY turn DESC LIMIT 1", (key_id, session_id))
        if not got:
            return None
        e = got[0][1]
        return SessionState(e.turn, e.prompt_tokens, e.output_tokens)

    def stats(self) -> dict[str, float | int]:
        """``depth`` (events queued) and ``oldest_age_s`` (0 when empty), for ``/health`` and metrics."""
        age = 0.0 if self.oldest_at_s is None else max(0.0, time.time() - self.oldest_at_s)
        return {"depth": self.depth, "oldest_age_s": round(age, 3)}

    def close(self) -> None:
        self._exec.shutdown(wait=True)
        self._conn.close()
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()


def open_outbox(path: str | None, directory: str | Path = ".") -> Outbox:
    """The outbox at ``path``, or by default the first ``tokenomy-outbox-<host>-<n>.db`` in
    ``directory`` that no live process holds (a dead replica's left-over queue included)."""
    if path is not None:
        return Outbox(path)
    host = socket.gethostname().split(".")[0] or "replica"
    for n in range(1024):
        try:
            return Outbox(os.path.join(directory, f"tokenomy-outbox-{host}-{n}.db"))
        except OutboxBusy:
            continue
    raise OutboxBusy(f"no free ledger outbox file in {directory}")


def queued_in(directory: str | Path) -> tuple[int, float | None]:
    """(events, oldest ``queued_at_s``) in the default outbox files under ``directory``, live or left
    by a dead replica; read-only, without taking any file's lock (``tokenomy usage``)."""
    total, oldest = 0, None
    for path in sorted(Path(directory).glob("tokenomy-outbox-*.db")):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            n, first = conn.execute("SELECT count(*), min(queued_at_s) FROM outbox").fetchone()
        except sqlite3.Error:  # no table yet, or not an outbox
            continue
        finally:
            conn.close()
        total += int(n)
        if first is not None:
            oldest = float(first) if oldest is None else min(oldest, float(first))
    return total, oldest


class OutboxCollector:
    """``tokenomy_gateway_ledger_outbox_depth`` and ``..._oldest_age_seconds``, read at each scrape."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.outbox.stats()
        yield GaugeMetricFamily("tokenomy_gateway_ledger_outbox_depth",
                                "Usage events in this replica's ledger outbox, not yet in PostgreSQL",
                                value=s["depth"])
        yield GaugeMetricFamily("tokenomy_gateway_ledger_outbox_oldest_age_seconds",
                                "Age of the oldest event in this replica's ledger outbox (0 when empty)",
                                value=s["oldest_age_s"])
