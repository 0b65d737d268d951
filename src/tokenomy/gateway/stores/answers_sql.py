"""Stored Responses answers (``previous_response_id``): one row per response id in the ledger's
database, so every gateway replica continues a chain whichever replica or backend served its
previous turn (:mod:`tokenomy.gateway.http.response_chain`).

:class:`SqlAnswers` runs on the ledger's synchronous SQLAlchemy engine (SQLite, or PostgreSQL
through psycopg for a fleet), each call in a worker thread; :class:`MemoryAnswers` keeps them in the
process (a gateway whose ledger has no SQL engine: tests, fakes). Rows older than ``ttl_s`` are
deleted as new ones are written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import sqlalchemy as sa

from tokenomy.gateway.stores.pg_tenancy import seeding_lock

log = logging.getLogger(__name__)

_metadata = sa.MetaData()
answers = sa.Table(
    "gateway_responses",
    _metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("owner", sa.String(), nullable=False),  # the tenant root (org node id) that may continue it
    sa.Column("created_s", sa.Float(), nullable=False, index=True),
    sa.Column("payload", sa.Text(), nullable=False),  # JSON: {"input": [...], "output": [...]}
)
_PRUNE_EVERY = 256  # writes between two deletions of expired rows


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    owner: str
    input: list[Any]
    output: list[Any]


class AnswerRows(Protocol):
    async def save(self, response_id: str, owner: str, input_items: list[Any], output: list[Any]) -> None: ...

    async def load(self, response_id: str) -> StoredAnswer | None: ...


class SqlAnswers:
    def __init__(self, engine: sa.Engine, ttl_s: float) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self._writes = 0
        self._created = False
        try:
            self._create()
        except sa.exc.OperationalError as e:  # a replica started while PostgreSQL is away: create on first use
            log.warning("stored answers: the database did not answer (%s); the table is created on first use",
                        type(e.orig or e).__name__)

    def _create(self) -> None:
        if self.engine.dialect.name == "postgresql":  # replicas starting together: one creates, the others wait
            with seeding_lock(self.engine):
                _metadata.create_all(self.engine)
        else:
            _metadata.create_all(self.engine)
        self._created = True

    async def save(self, response_id: str, owner: str, input_items: list[Any], output: list[Any]) -> None:
        payload = orjson.dumps({"input": input_items, "output": output}).decode()
        self._writes += 1
        prune = self._writes % _PRUNE_EVERY == 0
        await asyncio.to_thread(self._save, response_id, owner, payload, prune)

    def _save(self, response_id: str, owner: str, payload: str, prune: bool) -> None:
        now = time.time()
        if not self._created:
            self._create()
        with self.engine.begin() as conn:
            conn.execute(sa.delete(answers).where(answers.c.id == response_id))
            conn.execute(sa.insert(answers).values(id=response_id, owner=owner, created_s=now, payload=payload))
            if prune:
                conn.execute(sa.delete(answers).where(answers.c.created_s < now - self.ttl_s))

    async def load(self, response_id: str) -> StoredAnswer | None:
        return await asyncio.to_thread(self._load, response_id)

    def _load(self, response_id: str) -> StoredAnswer | None:
        if not self._created:
            self._create()
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(answers.c.owner, answers.c.created_s, answers.c.payload)
                               .where(answers.c.id == response_id)).first()
        if row is None or row.created_s < time.time() - self.ttl_s:
            return None
        data = orjson.loads(row.payload)
        return StoredAnswer(row.owner, data["input"], data["output"])


class MemoryAnswers:
    """In-process rows, least recently written forgotten past ``max_rows``."""

    def __init__(self, ttl_s: float, max_rows: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_rows = max_rows
        self._rows: OrderedDict[str, tuple[float, StoredAnswer]] = OrderedDict()

    async def save(self, response_id: str, owner: str, input_items: list[Any], output: list[Any]) -> None:
        self._rows[response_id] = (time.time(), StoredAnswer(owner, input_items, output))
        self._rows.move_to_end(response_id)
        while len(self._rows) > self.max_rows:
            self._rows.popitem(last=False)

    async def load(self, response_id: str) -> StoredAnswer | None:
        got = self._rows.get(response_id)
        if got is None or got[0] < time.time() - self.ttl_s:
            return None
        return got[1]
