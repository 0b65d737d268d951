"""The tenant tree on a real PostgreSQL server, shared by replicas: a key made or revoked on one
replica is known to the others within ``refresh_s``; replicas seeding together create each tenant once."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import sqlalchemy as sa

from tokenomy.gateway.ops.tenancy import NodeKind
from tokenomy.gateway.ops.tenancy_seed import TenantSeed, apply_seeds
from tokenomy.gateway.stores.pg_tenancy import PgTenantStore, pg_engine, pg_sync_url, seeding_lock
from tokenomy.gateway.stores.servers import PostgresServer
from tokenomy.gateway.stores.tenancy_sql import NODES

pytestmark = pytest.mark.integration
SECRET = b"s" * 32


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_key_made_or_revoked_on_one_replica_holds_on_the_others_within_refresh_s(pg_srv: PostgresServer) -> None:
    clock = Clock()
    a = PgTenantStore(pg_engine(pg_srv.url), SECRET, refresh_s=1.0, clock=clock)
    b = PgTenantStore(pg_engine(pg_srv.url), SECRET, refresh_s=1.0, clock=clock)
    b.authenticate("tk-warm")  # b looked just now: it does not look again for 1 s
    org = a.create_node(NodeKind.ORG, "org-refresh", None)
    team = a.create_node(NodeKind.TEAM, "team", org.id)
    node, raw = a.create_key(team.id, "key")
    assert b.authenticate(raw) is None
    clock.t += 1.0
    assert b.authenticate(raw) is not None and b.authenticate(raw).id == node.id  # type: ignore[union-attr]
    a.revoke(node.id)
    assert b.authenticate(raw) is not None  # within refresh_s the old tree still answers
    clock.t += 1.0
    assert b.authenticate(raw) is None


def test_replicas_seeding_together_create_each_tenant_once(pg_srv: PostgresServer) -> None:
    seeds = (TenantSeed.model_validate({"org": "org-seeded", "teams": [{"name": "t", "keys": [{"name": "k"}]}]}),)
    errors: list[BaseException] = []

    def replica() -> None:
        try:
            store = PgTenantStore(pg_engine(pg_srv.url), SECRET)
            with seeding_lock(store.engine):
                store.reload()
                apply_seeds(store, seeds)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=replica) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    with pg_engine(pg_srv.url).connect() as conn:
        names = conn.execute(sa.select(NODES.c.name).where(NODES.c.name.in_(["org-seeded", "t", "k"]))).scalars().all()
    assert sorted(names) == ["k", "org-seeded", "t"]
    assert pg_sync_url("postgresql+asyncpg://u@h/db") == "postgresql+psycopg://u@h/db"


def test_a_replica_looks_for_tenant_changes_off_its_event_loop(pg_srv: PostgresServer) -> None:
    """A slow PostgreSQL stalled every request of a replica: the change check ran on the event loop
    (found by benchmarks/chaos.py's slow-PostgreSQL fault). Now a request authenticates against the
    loaded tree while a worker thread looks, and the new tree is taken once it has been read."""
    clock = Clock()
    a = PgTenantStore(pg_engine(pg_srv.url), SECRET, refresh_s=1.0, clock=clock)
    b = PgTenantStore(pg_engine(pg_srv.url), SECRET, refresh_s=1.0, clock=clock)
    b.authenticate("tk-warm")
    team = a.create_node(NodeKind.TEAM, "team", a.create_node(NodeKind.ORG, "org-off-loop", None).id)
    node, raw = a.create_key(team.id, "key")
    slow = threading.Event()  # PostgreSQL answers only once the test says so
    looked_on: list[threading.Thread] = []
    fetch = b._fetch_if_changed

    def slow_fetch() -> Any:
        looked_on.append(threading.current_thread())
        assert slow.wait(30), "the check was never released"
        return fetch()

    b._fetch_if_changed = slow_fetch  # type: ignore[method-assign]

    async def requests() -> None:
        clock.t += 1.0
        assert b.authenticate(raw) is None  # answered at once from the loaded tree, the check under way
        assert b.authenticate(raw) is None  # one check at a time
        slow.set()
        assert b._refreshing is not None
        await b._refreshing
        found = b.authenticate(raw)
        assert found is not None and found.id == node.id

    asyncio.run(requests())
    assert len(looked_on) == 1 and looked_on[0] is not threading.main_thread()
