"""The ledger outbox: durable across a reopen, oldest first, one file per process; the
``OutboxLedger`` on a real PostgreSQL: serving while it is stopped, draining exactly once when it is
back, and after a crash between a drained batch's insert and its delete."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest
import sqlalchemy as sa

from tokenomy.gateway.metering.ledger import UsageEvent
from tokenomy.gateway.stores.outbox import Outbox, OutboxBusy, OutboxCollector, open_outbox
from tokenomy.gateway.stores.outbox_ledger import OutboxLedger
from tokenomy.gateway.stores.pg_ledger import PgLedger
from tokenomy.gateway.stores.pg_tenancy import pg_engine
from tokenomy.gateway.stores.servers import PostgresServer


def event(rid: str, key: str = "k", cost: float = 0.01, session: str = "", turn: int = 0) -> UsageEvent:
    return UsageEvent(rid, 1_800_000_000.0, f"org/team/{key}", key, "m", "b1", "chat", False, 200, "ok", session,
                      turn, 100, 100, 0, 0, 10, 0, 100, cost * 0.5, 0.0, cost * 0.5, cost, 0.0, 0.01, 0.001, 0.1)


def test_the_outbox_is_durable_across_a_reopen_and_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "ob.db"

    async def write() -> None:
        ob = Outbox(path)
        try:
            await asyncio.gather(*(ob.append(event(f"r{i}")) for i in range(5)))  # one group commit
            await ob.append(event("r5"))
            await ob.append(event("r0", cost=9.0))  # the same request id again: ignored
            assert ob.depth == 6 and ob.stats()["depth"] == 6
        finally:
            ob.close()

    async def read() -> None:
        ob = Outbox(path)
        try:
            assert ob.depth == 6 and ob.oldest_at_s is not None
            batch = await ob.oldest(4)
            assert [e.request_id for _, e in batch] == ["r0", "r1", "r2", "r3"]
            assert batch[0][1].cost_usd == 0.01 and batch[0][1] == event("r0")
            await ob.delete([s for s, _ in batch])
            assert [e.request_id for _, e in await ob.oldest(10)] == ["r4", "r5"]
            assert (await ob.find("r5")) == event("r5") and await ob.find("r0") is None
            await ob.delete([s for s, _ in await ob.oldest(10)])
            assert ob.stats() == {"depth": 0, "oldest_age_s": 0.0}
            names = {m.name for m in OutboxCollector(ob).collect()}
            assert names == {"tokenomy_gateway_ledger_outbox_depth", "tokenomy_gateway_ledger_outbox_oldest_age_seconds"}
        finally:
            ob.close()

    asyncio.run(write())
    asyncio.run(read())


def test_one_outbox_file_per_process(tmp_path: Path) -> None:
    a = open_outbox(None, tmp_path)
    b = open_outbox(None, tmp_path)  # a second replica on the same disk: the next file
    try:
        assert a.path != b.path and a.path.endswith("-0.db") and b.path.endswith("-1.db")
        with pytest.raises(OutboxBusy):
            Outbox(a.path)
    finally:
        a.close()
        b.close()
    c = open_outbox(None, tmp_path)  # restarted: the first file again (a dead replica's queue drains)
    try:
        assert c.path.endswith("-0.db")
    finally:
        c.close()


def _rows(pg: PostgresServer, key: str) -> list[str]:
    with pg_engine(pg.url).connect() as conn:
        return [str(r[0]) for r in conn.execute(sa.text("SELECT request_id FROM usage_events WHERE key_id = :k"),
                                                 {"k": key})]


@pytest.mark.integration
def test_postgres_stopped_events_wait_in_the_outbox_and_drain_once(pg_srv: PostgresServer, tmp_path: Path) -> None:
    key = f"k{secrets.token_hex(3)}"

    async def main() -> None:
        lg = await OutboxLedger(pg_srv.url, Outbox(tmp_path / "ob.db"), record_timeout_s=1.0, retry_s=0.1).start()
        try:
            await lg.record(event(f"{key}-before", key))
            assert lg.outbox.depth == 0
            pg_srv.stop(remove=False)
            try:
                for turn in range(3):  # returns: each event is on the replica's disk
                    await lg.record(event(f"{key}-down-{turn}", key, session="s", turn=turn))
                assert lg.outbox.depth == 3 and lg.failed_at_s is None
                assert await lg.exists(f"{key}-down-0") and not await lg.exists(f"{key}-never")
                assert await lg.cost(f"{key}-down-1") == 0.01
                state = await lg.session_state(key, "s")
                assert state is not None and state.turn == 2
            finally:
                pg_srv.start()
            await asyncio.wait_for(lg.drained(), 30)
            await lg.record(event(f"{key}-after", key))
        finally:
            await lg.aclose()
        rows = _rows(pg_srv, key)
        assert sorted(rows) == sorted([f"{key}-before", f"{key}-after"] + [f"{key}-down-{t}" for t in range(3)])

    asyncio.run(main())


@pytest.mark.integration
def test_a_crash_between_insert_and_delete_drains_exactly_once(pg_srv: PostgresServer, tmp_path: Path) -> None:
    key = f"k{secrets.token_hex(3)}"
    path = tmp_path / "ob.db"

    async def crashed() -> None:  # queued, then inserted into PostgreSQL, then dead before the delete
        ob = Outbox(path)
        try:
            for i in range(4):
                await ob.append(event(f"{key}-{i}", key))
        finally:
            ob.close()
        pg = await PgLedger(pg_srv.url).start()
        try:
            await pg.record(event(f"{key}-0", key))
            await pg.record(event(f"{key}-1", key))
        finally:
            await pg.aclose()

    async def restarted() -> None:  # the same disk: what is left drains at start, twice over harmlessly
        lg = await OutboxLedger(pg_srv.url, Outbox(path), retry_s=0.1).start()
        try:
            await asyncio.wait_for(lg.drained(), 30)
            assert lg.outbox.stats()["depth"] == 0
        finally:
            await lg.aclose()

    asyncio.run(crashed())
    asyncio.run(restarted())
    assert sorted(_rows(pg_srv, key)) == sorted(f"{key}-{i}" for i in range(4))


def test_queued_in_counts_every_outbox_file_of_a_directory_without_taking_its_lock(tmp_path: Path) -> None:
    from tokenomy.gateway.stores.outbox import queued_in

    assert queued_in(tmp_path) == (0, None)

    async def fill() -> None:
        live, dead = open_outbox(None, tmp_path), open_outbox(None, tmp_path)
        await asyncio.gather(*(live.append(event(f"l{i}")) for i in range(2)))
        await dead.append(event("d0"))
        dead.close()  # a dead replica's queue stays on disk
        try:
            n, oldest = queued_in(tmp_path)  # while the live one holds its file
            assert n == 3 and oldest is not None
            assert live.stats()["depth"] == 2
        finally:
            live.close()

    asyncio.run(fill())
    (tmp_path / "tokenomy-outbox-x-9.db").write_bytes(b"")  # not an outbox (yet): skipped
    assert queued_in(tmp_path)[0] == 3
