"""``OutboxLedger``: the PostgreSQL ledger that keeps serving while PostgreSQL is away (``ops.shared.
on_outage.ledger: outbox``, the fleet default).

``record`` commits to PostgreSQL within ``record_timeout_s``; when that fails or takes longer, the
event is appended to this replica's :class:`~tokenomy.gateway.stores.outbox.Outbox` (durable: an
fsync) and ``record`` returns, so the client still sees completion only once its event is on a
disk. While the outbox holds anything, new events go there too (oldest first stays true). A
drainer task inserts the oldest batch into PostgreSQL with ``ON CONFLICT (request_id) DO
NOTHING``, then deletes it from the outbox: a crash between the two re-inserts a batch that the
conflict clause ignores, so each request id is in ``usage_events`` exactly once (an event whose
PostgreSQL commit timed out yet landed is ignored the same way).

Reads (``exists``, ``session_state``, ``cost``) look in the outbox too. The ledger never reports a
failed commit (``failed_at_s`` stays None) while the outbox takes writes: the guard keeps admitting.
Outboxed events have no PostgreSQL transaction id (``pop_xid`` gives None): their settles count
through the budget holds as always; only a settle whose hold Redis lost (a Redis restart during the
PostgreSQL outage, re-seeded from PostgreSQL before the drain) is not counted again (docs/gateway-ops.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import asdict

from sqlalchemy.dialects import postgresql

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.metering.ledger import UsageEvent
from tokenomy.gateway.metering.meter import SessionState
from tokenomy.gateway.stores.ledger_sql import usage_events
from tokenomy.gateway.stores.outbox import Outbox
from tokenomy.gateway.stores.pg_ledger import _DOWN, PgLedger

log = logging.getLogger(__name__)
_INSERT = postgresql.insert(usage_events).on_conflict_do_nothing(index_elements=["request_id"])


class OutboxLedger(PgLedger):
    """``PgLedger`` with a local outbox (``record_timeout_s``: a commit slower than this is outboxed;
    ``retry_s``: the drainer's pause after PostgreSQL refused a batch)."""

    def __init__(self, url: str, outbox: Outbox, *, pool_size: int = 5, record_timeout_s: float = 1.0,
                 retry_s: float = 0.5, drain_batch: int = 256) -> None:
        super().__init__(url, pool_size=pool_size)
        self.outbox = outbox
        self.record_timeout_s = record_timeout_s
        self.retry_s = retry_s
        self.drain_batch = drain_batch
        self.pg_failed_at_s: float | None = None  # PostgreSQL's own health (for logs and tests)
        self._kick = asyncio.Event()
        self._drainer: asyncio.Task[None] | None = None
        self._table_checked = False  # the ledger's table made sure of (at start, or before the first drain)

    @property
    def failed_at_s(self) -> float | None:
        """None: the outbox takes what PostgreSQL cannot (the guard must not refuse)."""
        return None

    @failed_at_s.setter
    def failed_at_s(self, value: float | None) -> None:
        self.pg_failed_at_s = value

    async def start(self) -> OutboxLedger:
        if self._writer is None:
            try:
                await asyncio.wait_for(self.create_table(), self.timeout_s)
                self._table_checked = True
            except Exception as e:  # noqa: BLE001 (a replica started while PostgreSQL is away: the outbox serves)
                log.warning("ledger: PostgreSQL did not answer at start-up (%s); events wait in the outbox "
                            "until it does", type(e).__name__)
            self.start_writer()
        if self._drainer is None:
            self._drainer = asyncio.get_running_loop().create_task(self._drain(), name="ledger-outbox-drainer")
            self._kick.set()  # a queue left by a previous run drains now
        return self

    async def record(self, event: UsageEvent, alone: bool = False) -> None:
        if not self.outbox.queued:
            try:
                await asyncio.wait_for(super().record(event), self.record_timeout_s)
                return
            except Exception as e:  # noqa: BLE001 (PostgreSQL down, slow or refusing: the outbox takes it)
                log.warning("ledger: PostgreSQL did not commit %s (%s); queued in the outbox",
                            event.request_id, type(e).__name__)
        await self.outbox.append(event)
        self._kick.set()

    async def _drain(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            while self.outbox.queued:
                try:
                    batch = await self.outbox.oldest(self.drain_batch)
                    if batch:
                        if not self._table_checked:  # started while PostgreSQL was away
                            await asyncio.wait_for(self.create_table(), self.timeout_s)
                            self._table_checked = True
                        await asyncio.wait_for(self._insert([e for _, e in batch]), self.timeout_s)
                        await self.outbox.delete([s for s, _ in batch])
                        log.info("ledger outbox: drained %d events, %d left", len(batch), self.outbox.depth)
                        continue
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 (PostgreSQL still away: try again shortly)
                    log.warning("ledger outbox: drain failed (%s: %s); %d queued", type(e).__name__, e,
                                self.outbox.depth)
                await asyncio.sleep(self.retry_s)  # nothing committed yet, or PostgreSQL refused

    async def _insert(self, events: list[UsageEvent]) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(_INSERT, [asdict(e) for e in events])

    async def drained(self) -> None:
        """Return once the outbox is empty (tests; shutdown)."""
        while self.outbox.queued:
            await asyncio.sleep(0.05)

    async def exists(self, request_id: str) -> bool:
        if await self.outbox.find(request_id) is not None:
            return True
        try:
            return await asyncio.wait_for(self.cost(request_id), self.record_timeout_s) is not None
        except _DOWN as e:  # unknown while PostgreSQL is away: served, and recorded once (ON CONFLICT)
            log.warning("ledger: cannot check request id %s in PostgreSQL (%s)", request_id, type(e).__name__)
            return False

    async def session_state(self, key_id: str, session_id: str) -> SessionState | None:
        mine = await self.outbox.session_state(key_id, session_id)
        try:
            theirs = await asyncio.wait_for(super().session_state(key_id, session_id), self.record_timeout_s)
        except (GatewayError, *_DOWN):
            theirs = None
        if mine is None or (theirs is not None and theirs.turn > mine.turn):
            return theirs
        return mine

    async def cost(self, request_id: str) -> float | None:
        queued = await self.outbox.find(request_id)
        if queued is not None:
            return queued.cost_usd
        return await super().cost(request_id)

    async def aclose(self) -> None:
        if self._drainer is not None:
            self._drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drainer
            self._drainer = None
        await super().aclose()
        self.outbox.close()
