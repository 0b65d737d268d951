"""The console's reads of the usage ledger: aggregated in SQL, paginated, on indexes.

Every query is bounded: a time window (``ts_s`` is indexed by :meth:`ConsoleQueries.prepare`),
a page of at most ``PAGE_ROWS`` groups (one row more is read to know whether a next page exists),
or one session's turns (the ledger's ``(key_id, session_id, turn)`` index). No query returns
events one by one except a single session's turns, so a page costs the same with 10 or 10,000
sessions in its window up to the SQL aggregation itself. Blocking: call from a thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

log = logging.getLogger(__name__)

PAGE_ROWS = 25  # groups per page (sessions, live sessions)
MAX_TURNS = 500  # turns shown for one session

_T = sa.table(
    "usage_events",
    *(sa.column(n) for n in (
        "request_id", "ts_s", "tenant_path", "key_id", "model", "backend", "status", "outcome", "session_id",
        "turn", "prompt_tokens", "input_tokens", "incremental_prefill_tokens", "history_tokens",
        "output_tokens", "cached_tokens", "recomputed_tokens", "cost_recomputed_usd", "cost_cached_usd",
        "cost_output_usd", "cost_usd", "cache_savings_usd", "ttft_s", "e2e_s", "reasoning_tokens",
        "requested_model", "endpoint")),
)
c = _T.c

TOKEN_CLASSES = ("input_tokens", "incremental_prefill_tokens", "history_tokens", "output_tokens", "cached_tokens",
                 "recomputed_tokens", "reasoning_tokens")
COST_CLASSES = ("cost_recomputed_usd", "cost_cached_usd", "cost_output_usd")


@dataclass(frozen=True, slots=True)
class SpendRow:
    """One time bucket of one tenant path: token and cost sums by class."""

    bucket: int  # index of the bucket from the window's start
    tenant_path: str
    requests: int
    tokens: dict[str, int]
    costs: dict[str, float]
    savings_usd: float


@dataclass(frozen=True, slots=True)
class SessionRow:
    key_id: str
    tenant_path: str
    session_id: str
    turns: int
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_usd: float
    savings_usd: float
    first_s: float
    last_s: float


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[Any]
    page: int
    has_next: bool


class ConsoleQueries:
    """Read-only queries on the ledger's ``usage_events`` table (SQLite or PostgreSQL)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._pg = engine.dialect.name == "postgresql"

    def prepare(self) -> None:
        """Create the time index the windowed queries use (idempotent; the ledger's own indexes are
        by session and by tenant path). A database that does not answer (a fleet replica started while
        PostgreSQL is away) skips it: the replica that started with it made the index."""
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.text("CREATE INDEX IF NOT EXISTS ix_usage_ts ON usage_events (ts_s)"))
        except sa.exc.OperationalError as e:
            log.warning("console: the ledger's database did not answer (%s); its time index is not checked",
                        type(e.orig or e).__name__)

    def _bucket(self, since_s: float, bucket_s: float) -> Any:
        offset = (c.ts_s - since_s) / bucket_s
        return sa.func.floor(offset) if self._pg else sa.cast(offset, sa.Integer)  # ts >= since: cast truncates

    def spend(self, since_s: float, until_s: float, bucket_s: float) -> list[SpendRow]:
        """Sums per (bucket, tenant path) in ``[since_s, until_s)``: at most buckets x keys rows."""
        b = self._bucket(since_s, bucket_s).label("b")
        cols = [sa.func.sum(getattr(c, n)) for n in (*TOKEN_CLASSES, *COST_CLASSES, "cache_savings_usd")]
        stmt = (sa.select(b, c.tenant_path, sa.func.count(), *cols)
                .where(c.ts_s >= since_s, c.ts_s < until_s).group_by(b, c.tenant_path))
        out = []
        with self.engine.connect() as conn:
            for row in conn.execute(stmt):
                vals = list(row[3:])
                nt, nc = len(TOKEN_CLASSES), len(COST_CLASSES)
                tokens = {n: int(v or 0) for n, v in zip(TOKEN_CLASSES, vals[:nt], strict=True)}
                costs = {n: float(v or 0.0) for n, v in zip(COST_CLASSES, vals[nt:nt + nc], strict=True)}
                out.append(SpendRow(int(row[0]), str(row[1]), int(row[2]), tokens, costs, float(vals[-1] or 0.0)))
        return out

    def period_spend(self, month_start_s: float, day_start_s: float) -> dict[str, tuple[float, float]]:
        """Per tenant path: (spent this month, spent today), in USD."""
        today = sa.func.sum(sa.case((c.ts_s >= day_start_s, c.cost_usd), else_=0.0))
        stmt = (sa.select(c.tenant_path, sa.func.sum(c.cost_usd), today)
                .where(c.ts_s >= month_start_s).group_by(c.tenant_path))
        with self.engine.connect() as conn:
            return {str(p): (float(m or 0.0), float(d or 0.0)) for p, m, d in conn.execute(stmt)}

    def _sessions(self, since_s: float, order: Any, page: int) -> Page:
        cost = sa.func.sum(c.cost_usd)
        last = sa.func.max(c.ts_s)
        stmt = (sa.select(c.key_id, sa.func.min(c.tenant_path), c.session_id, sa.func.count(),
                          sa.func.sum(c.prompt_tokens), sa.func.sum(c.output_tokens), sa.func.sum(c.cached_tokens),
                          cost, sa.func.sum(c.cache_savings_usd), sa.func.min(c.ts_s), last)
                .where(c.ts_s >= since_s, c.session_id != "")
                .group_by(c.key_id, c.session_id)
                .order_by(cost.desc() if order == "cost" else last.desc(), c.key_id, c.session_id)
                .limit(PAGE_ROWS + 1).offset(page * PAGE_ROWS))
        with self.engine.connect() as conn:
            rows = [SessionRow(str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4] or 0), int(r[5] or 0),
                               int(r[6] or 0), float(r[7] or 0.0), float(r[8] or 0.0), float(r[9]), float(r[10]))
                    for r in conn.execute(stmt)]
        return Page(rows[:PAGE_ROWS], page, len(rows) > PAGE_ROWS)

    def top_sessions(self, since_s: float, page: int = 0) -> Page:
        """Sessions active since ``since_s``, most expensive first."""
        return self._sessions(since_s, "cost", page)

    def recent_sessions(self, since_s: float, page: int = 0) -> Page:
        """Sessions active since ``since_s``, most recently active first."""
        return self._sessions(since_s, "recent", page)

    def last_backend(self, key_id: str, session_id: str) -> str | None:
        """The backend that served the session's latest turn (the session index)."""
        stmt = (sa.select(c.backend).where(c.key_id == key_id, c.session_id == session_id)
                .order_by(c.turn.desc(), c.ts_s.desc()).limit(1))
        with self.engine.connect() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else str(row[0])

    def turns(self, key_id: str, session_id: str) -> list[dict[str, Any]]:
        """The session's turns, in order (at most ``MAX_TURNS``)."""
        stmt = (sa.select(_T).where(c.key_id == key_id, c.session_id == session_id)
                .order_by(c.turn, c.ts_s).limit(MAX_TURNS))
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]
