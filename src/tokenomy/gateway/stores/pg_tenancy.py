"""The tenant tree on PostgreSQL, shared by every gateway replica.

Same tables and semantics as the SQLite ``TenantStore`` (SQLAlchemy Core; the psycopg driver: the
tree is read at start-up and on change, written only by admin calls). Authentication reads the
in-memory tree; a replica looks for another replica's change (a ``tk_meta.version`` bump) at most
every ``refresh_s`` seconds instead of on every request, on a worker thread (the request never
waits for PostgreSQL), so a revocation made anywhere takes effect fleet-wide within ``refresh_s``
plus one PostgreSQL round trip.

Replicas starting together seed the config's tenants one at a time (``seeding_lock``: a
PostgreSQL advisory lock), so a tenant is never created twice.

Each replica writes the tree it loaded to a snapshot on its own disk (``snapshot``: a JSON file
beside the ledger outbox, mode 0600, replaced atomically at every change; key digests, never raw
keys). A replica (re)started while PostgreSQL is unreachable authenticates from that snapshot
(``offline``) and takes up changes once PostgreSQL answers again; without one it cannot start.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tokenomy.gateway.ops.keys import KeyIndex
from tokenomy.gateway.ops.tenancy import Node, TenantTree
from tokenomy.gateway.stores.tenancy_sql import META, METADATA, TenantStore

log = logging.getLogger(__name__)
_SEED_LOCK = 0x746B_7365_6564  # "tkseed": one advisory lock id for the tenant seeding
TENANT_SNAPSHOT = "tokenomy-tenants.json"
"""The tenant tree's snapshot file, in ``ops.shared.outbox_dir``."""


def write_snapshot(path: Path, version: int, rows: Sequence[Any]) -> None:
    """The tree's rows at ``version`` into ``path`` (a temporary file renamed over it: never torn)."""
    data = {"version": version, "rows": [dict(r) for r in rows]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_snapshot(path: Path) -> tuple[int, list[dict[str, Any]]] | None:
    """(version, rows) of the snapshot at ``path``; None when there is none or it cannot be read."""
    try:
        data = json.loads(path.read_text())
        return int(data["version"]), [dict(r) for r in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def pg_sync_url(url: str) -> str:
    """``postgresql://`` (any driver) URLs with the psycopg driver."""
    for prefix in ("postgresql+psycopg://", "postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError(f"not a PostgreSQL URL: {url!r}")


def pg_engine(url: str, pool_size: int = 2) -> Engine:
    return sa.create_engine(pg_sync_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True,
                            connect_args={"connect_timeout": 2})


@contextmanager
def seeding_lock(engine: Engine) -> Iterator[None]:
    """Hold the fleet-wide seeding lock (other replicas' seeding waits) for the ``with`` body."""
    with engine.connect() as conn:
        conn.execute(sa.select(sa.func.pg_advisory_lock(_SEED_LOCK)))
        try:
            yield
        finally:
            conn.execute(sa.select(sa.func.pg_advisory_unlock(_SEED_LOCK)))
            conn.commit()


class PgTenantStore(TenantStore):
    """``TenantStore`` on PostgreSQL with a time-gated change check (``refresh_s``)."""

    def __init__(self, engine: Engine, server_secret: bytes, refresh_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, snapshot: Path | None = None) -> None:
        # TenantStore.__init__ opens a direct SQLite connection for its per-request version read;
        # here the check is time-gated through the engine instead.
        self.engine = engine
        self.tree = TenantTree()
        self.keys = KeyIndex(server_secret)
        self._mac_key = hashlib.blake2b(b"tk-live-cache:" + server_secret, digest_size=32).digest()
        self._live = {}
        self._version = -1
        self.refresh_s = refresh_s
        self._clock = clock
        self._next_check = -float("inf")
        # TenantStore.authenticate's own gate; refresh_if_changed below keeps its own too (admin reads call it)
        self.refresh_interval_s = refresh_s
        self.clock = clock
        self._next_refresh_s = -float("inf")
        self._refreshing: asyncio.Task[None] | None = None
        self.snapshot = snapshot
        self._snapshot_version = -1
        self.offline = False  # started from the snapshot: PostgreSQL did not answer
        try:
            with seeding_lock(engine):
                METADATA.create_all(engine)
                with engine.begin() as conn:
                    if conn.execute(sa.select(META.c.version)).first() is None:
                        conn.execute(META.insert().values(id=1, version=0))
            self.reload()
        except sa.exc.OperationalError:
            saved = read_snapshot(snapshot) if snapshot is not None else None
            if saved is None:
                raise
            log.warning("tenant tree: PostgreSQL did not answer; authenticating from the snapshot %s "
                        "(version %d) until it does", snapshot, saved[0])
            self.offline = True
            self._snapshot_version = saved[0]
            self._apply(*saved)

    def _apply(self, version: int, rows: Sequence[Any]) -> None:
        super()._apply(version, rows)
        if self.snapshot is not None and version != self._snapshot_version:
            try:
                write_snapshot(self.snapshot, version, rows)
                self._snapshot_version = version
            except OSError as e:  # the snapshot only helps a restart: never fail a reload over it
                log.warning("tenant tree: cannot write the snapshot %s (%s)", self.snapshot, e)

    def refresh_if_changed(self) -> None:
        now = self._clock()
        if now < self._next_check:
            return
        self._next_check = now + self.refresh_s
        fetched = self._fetch_if_changed()
        if fetched is not None:
            self._apply(*fetched)

    def _fetch_if_changed(self) -> tuple[int, Sequence[Any]] | None:
        """The tree's rows when another process changed it, else None (I/O only: any thread)."""
        try:
            with self.engine.connect() as conn:
                version = conn.execute(sa.select(META.c.version).where(META.c.id == 1)).scalar_one()
            return self._fetch() if version != self._version else None
        except sa.exc.OperationalError as e:  # PostgreSQL away: keep the tree we have, look again later
            log.warning("tenant tree: cannot check for changes (%s); keeping the loaded tree", e.orig or e)
            return None

    def authenticate(self, raw_key: str) -> Node | None:
        """As ``TenantStore.authenticate``, but inside a running event loop the change check runs on a
        worker thread and the request goes on with the loaded tree: a slow or unreachable PostgreSQL
        (each connect may take ``connect_timeout``) never stalls the requests of this replica."""
        now = self.clock()
        if now >= self._next_refresh_s:
            self._next_refresh_s = now + self.refresh_interval_s  # the base class's gate: passed here
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (the CLI, admin tools): check in line
                self.refresh_if_changed()
            else:
                if self._refreshing is None or self._refreshing.done():
                    self._refreshing = loop.create_task(self._refresh_off_loop(), name="tenant-tree-refresh")
        return super().authenticate(raw_key)

    async def _refresh_off_loop(self) -> None:
        fetched = await asyncio.to_thread(self._fetch_if_changed)
        if fetched is not None and fetched[0] > self._version:  # an admin write may have reloaded meanwhile
            self._apply(*fetched)  # on the loop's thread, between requests
