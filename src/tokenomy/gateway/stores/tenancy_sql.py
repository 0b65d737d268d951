"""The tenant tree and key digests in SQL (SQLAlchemy Core; SQLite by default).

``TenantStore`` keeps an in-memory ``TenantTree`` + ``KeyIndex`` for the request path and writes
every change through to the database. Changes made by another process (``tokenomy keys revoke``
against the same file) are picked up on the next ``authenticate``: every write bumps
``tk_meta.version`` and ``authenticate`` reloads when it differs, so a revocation is effective on
the next request wherever it was made.

Hot keys skip the HMAC: a key that authenticated is remembered under a keyed BLAKE2b MAC of it
(never the raw key) until the next reload, which every change — a revocation included — causes.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tokenomy.gateway.ops.keys import KeyIndex, key_hint, new_api_key
from tokenomy.gateway.ops.tenancy import Node, NodeKind, NodeLimits, TenantTree

METADATA = sa.MetaData()
_LIVE_CACHE_KEYS = 100_000  # bound on remembered keys (~100 bytes each)

NODES = sa.Table(
    "tk_nodes", METADATA,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("kind", sa.String(8), nullable=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("parent_id", sa.String(40), sa.ForeignKey("tk_nodes.id"), nullable=True),
    sa.Column("limits_json", sa.Text, nullable=False),
    sa.Column("key_digest", sa.String(64), nullable=True, unique=True),
    sa.Column("key_hint", sa.String(20), nullable=True),
    sa.Column("revoked", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at_s", sa.Float, nullable=False),
)

META = sa.Table(
    "tk_meta", METADATA,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("secret", sa.String(64), nullable=True),
)


def stored_secret(engine: Engine) -> bytes:
    """The server secret kept in the database, made on first use.

    For when the config sets no ``ops.server_secret``: key digests then resist a leak of the
    key list but not of the whole database file. Production configs should set the secret.
    """
    METADATA.create_all(engine)
    with engine.begin() as conn:
        row = conn.execute(sa.select(META.c.secret).where(META.c.id == 1)).first()
        if row is None:
            conn.execute(META.insert().values(id=1, version=0, secret=secrets.token_hex(32)))
        elif row[0] is None:
            conn.execute(META.update().where(META.c.id == 1).values(secret=secrets.token_hex(32)))
        return str(conn.execute(sa.select(META.c.secret).where(META.c.id == 1)).scalar_one()).encode()


def sqlite_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get WAL mode and a busy timeout."""
    engine = sa.create_engine(url)
    if engine.dialect.name == "sqlite":
        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=5000")
            cur.close()
    return engine


def direct_connection(engine: Engine) -> sqlite3.Connection:
    """A DBAPI connection to the engine's SQLite file for the request path's few fixed statements.

    SQLAlchemy defines the schema and runs everything else; the hot path skips its statement
    construction (~10x the cost of the SQLite call). Autocommit mode: callers open their own
    ``BEGIN IMMEDIATE`` transactions.
    """
    if engine.dialect.name != "sqlite" or not engine.url.database or engine.url.database == ":memory:":
        raise ValueError(f"{engine.url}: token operations need an SQLite file (not in-memory)")
    conn = sqlite3.connect(engine.url.database, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


class TenantStore:
    """CRUD over the tenant tree; every method validates before it writes."""

    def __init__(self, engine: Engine, server_secret: bytes, *, refresh_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``refresh_interval_s``: how often :meth:`authenticate` looks for changes made by other
        processes (a revocation by the CLI takes effect within it; this process's own writes at once)."""
        self.engine = engine
        self.refresh_interval_s = refresh_interval_s
        self.clock = clock
        self._next_refresh_s = -math.inf
        self.tree = TenantTree()
        self.keys = KeyIndex(server_secret)
        self._mac_key = hashlib.blake2b(b"tk-live-cache:" + server_secret, digest_size=32).digest()
        self._live: dict[bytes, Node] = {}  # MAC of a raw key -> its live key node, until the next reload
        self._version = -1
        METADATA.create_all(engine)
        with engine.begin() as conn:
            if conn.execute(sa.select(META.c.version)).first() is None:
                conn.execute(META.insert().values(id=1, version=0))
        self._direct = direct_connection(engine)
        self.reload()

    # --- reading -------------------------------------------------------------------------------

    def reload(self) -> None:
        self._apply(*self._fetch())

    def _fetch(self) -> tuple[int, Sequence[Any]]:
        """The tree's version and rows, read in one connection (I/O only: any thread may call it)."""
        with self.engine.connect() as conn:
            version = conn.execute(sa.select(META.c.version)).scalar_one()
            rows = conn.execute(sa.select(NODES)).mappings().all()
        return int(version), rows

    def _apply(self, version: int, rows: Sequence[Any]) -> None:
        """Replace the in-memory tree and key index by ``rows`` (on the thread that authenticates)."""
        tree = TenantTree()
        self.keys.clear()
        for r in rows:
            node = Node(r["id"], NodeKind(r["kind"]), r["name"], r["parent_id"],
                        NodeLimits.model_validate_json(r["limits_json"]), bool(r["revoked"]))
            tree.put(node)
            if r["key_digest"] and not node.revoked:
                self.keys.add(r["key_digest"], node.id)
        self.tree = tree
        self._live = {}
        self._version = version

    def refresh_if_changed(self) -> None:
        """Reload when any process changed the tree since we last read it (one indexed read)."""
        (version,) = self._direct.execute("SELECT version FROM tk_meta WHERE id = 1").fetchone()
        if version != self._version:
            self.reload()

    def authenticate(self, raw_key: str) -> Node | None:
        """The key's node when ``raw_key`` is a live key (not revoked, ancestors not revoked)."""
        now = self.clock()
        if now >= self._next_refresh_s:  # not one database read per request
            self._next_refresh_s = now + self.refresh_interval_s
            self.refresh_if_changed()
        mac = hashlib.blake2b(raw_key.encode(), key=self._mac_key, digest_size=16).digest()
        node = self._live.get(mac)
        if node is not None:
            return node
        node_id = self.keys.lookup(raw_key)
        if node_id is None:
            return None
        if any(self.tree.get(i).revoked for i in self.tree.path(node_id)):
            return None
        node = self.tree.get(node_id)
        if len(self._live) < _LIVE_CACHE_KEYS:
            self._live[mac] = node
        return node

    def key_hints(self) -> dict[str, str]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(NODES.c.id, NODES.c.key_hint).where(NODES.c.key_hint.is_not(None)))
            return {r.id: r.key_hint for r in rows}

    # --- writing -------------------------------------------------------------------------------

    def create_node(self, kind: NodeKind, name: str, parent_id: str | None,
                    limits: NodeLimits | None = None) -> Node:
        """An org or team (use ``create_key`` for keys). ValueError when it would exceed its parent."""
        if kind is NodeKind.KEY:
            raise ValueError("use create_key for keys")
        return self._insert(kind, name, parent_id, limits or NodeLimits(), None, None)

    def create_key(self, team_id: str, name: str, limits: NodeLimits | None = None) -> tuple[Node, str]:
        """A key under ``team_id``; returns the node and the raw key, which is never stored."""
        return self.import_key(team_id, name, None, limits)

    def import_key(self, team_id: str, name: str, raw: str | None,
                   limits: NodeLimits | None = None) -> tuple[Node, str]:
        """Like ``create_key`` but accepting a given raw key (``None``: a fresh one)."""
        raw = raw or new_api_key()
        node = self._insert(NodeKind.KEY, name, team_id, limits or NodeLimits(),
                            self.keys.digest(raw), key_hint(raw))
        return node, raw

    def update_limits(self, node_id: str, limits: NodeLimits) -> Node:
        self.refresh_if_changed()
        self.tree.check_update(node_id, limits)
        node = self.tree.get(node_id)
        with self.engine.begin() as conn:
            conn.execute(NODES.update().where(NODES.c.id == node_id)
                         .values(limits_json=limits.model_dump_json()))
            self._bump(conn)
        self.reload()
        return self.tree.get(node.id)

    def revoke(self, node_id: str) -> Node:
        """Revoke a key, or a team/org and so every key below it; effective on the next request."""
        self.refresh_if_changed()
        self.tree.get(node_id)
        with self.engine.begin() as conn:
            conn.execute(NODES.update().where(NODES.c.id == node_id).values(revoked=True))
            self._bump(conn)
        self.reload()
        return self.tree.get(node_id)

    def _insert(self, kind: NodeKind, name: str, parent_id: str | None, limits: NodeLimits,
                digest: str | None, hint: str | None) -> Node:
        if not name or len(name) > 200:
            raise ValueError("name must be 1 to 200 characters")
        self.refresh_if_changed()
        self.tree.check_child(kind, parent_id, limits)
        node_id = f"{kind.value}_{secrets.token_hex(6)}"
        with self.engine.begin() as conn:
            conn.execute(NODES.insert().values(
                id=node_id, kind=kind.value, name=name, parent_id=parent_id,
                limits_json=limits.model_dump_json(), key_digest=digest, key_hint=hint,
                revoked=False, created_at_s=time.time()))
            self._bump(conn)
        self.reload()
        return self.tree.get(node_id)

    @staticmethod
    def _bump(conn: sa.Connection) -> None:
        conn.execute(META.update().where(META.c.id == 1).values(version=META.c.version + 1))


def node_json(node: Node, hint: str | None = None) -> dict[str, object]:
    """A node as the admin API and the CLI show it (never a digest)."""
    out: dict[str, object] = {"id": node.id, "kind": node.kind.value, "name": node.name,
                              "parent_id": node.parent_id, "revoked": node.revoked,
                              "limits": json.loads(node.limits.model_dump_json(exclude_defaults=True))}
    if hint is not None:
        out["key_hint"] = hint
    return out
