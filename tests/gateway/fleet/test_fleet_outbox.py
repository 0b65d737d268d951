"""A fleet replica with PostgreSQL stopped (``ops.shared.on_outage.ledger: outbox``, the default):
requests are still served and wait in the replica's outbox, which drains into PostgreSQL once it
is back, each request id exactly once; a replica killed with a non-empty outbox drains it when it
starts again from the same disk, and a replica restarted while PostgreSQL is down authenticates
from the tenant snapshot it left there."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from redis import Redis

from helpers.gateway_core_support import MODEL, FakeUpstream, serve
from helpers.polling import wait_for
from helpers.servers import postgres_server, redis_server
from tokenomy.cli.main import main
from tokenomy.gateway.http.replicas import Replica, start_replicas, stop_all
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.stores.pg_tenancy import TENANT_SNAPSHOT, pg_engine
from tokenomy.gateway.stores.servers import PostgresServer, free_port

pytestmark = pytest.mark.integration


@dataclass
class OneReplica:
    replica: Replica
    pg: PostgresServer
    key: str
    redis_url: str
    config: Path

    def chat(self, rid: str) -> httpx.Response:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        return httpx.post(f"{self.replica.url}/v1/chat/completions", json=body, timeout=30.0,
                          headers={"authorization": f"Bearer {self.key}", "x-request-id": rid})

    def outbox(self) -> dict[str, Any]:
        got: dict[str, Any] = httpx.get(f"{self.replica.url}/health", timeout=10.0).json()["ledger_outbox"]
        return got

    def ledger_ids(self, prefix: str) -> list[str]:
        with pg_engine(self.pg.url).connect() as conn:
            rows = conn.execute(sa.text("SELECT request_id FROM usage_events WHERE request_id LIKE :p"),
                                {"p": prefix + "%"}).all()
        return [str(r[0]) for r in rows]

    def spend(self) -> tuple[float, float]:
        """(the key's spend in Redis, the sum of its costs in the ledger)."""
        with pg_engine(self.pg.url).connect() as conn:
            key_id = str(conn.execute(sa.text("SELECT id FROM tk_nodes WHERE name = 'k'")).scalar_one())
            cost = float(conn.execute(sa.text("SELECT sum(cost_usd) FROM usage_events WHERE key_id = :k"),
                                      {"k": key_id}).scalar_one())
        r = Redis.from_url(self.redis_url)
        try:
            (bucket,) = r.keys(f"tk:bu:{key_id}:*")
            return float(r.hget(bucket, "spent") or 0.0), cost
        finally:
            r.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneReplica]:
    tmp = tmp_path_factory.mktemp("fleet-outbox")
    key = new_api_key()
    upstream = FakeUpstream()
    with redis_server(tmp) as redis, postgres_server() as pg, serve(upstream.app()) as up_url:
        config = tmp / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "backends": [{"id": "b1", "url": up_url}],
            "prices": {MODEL: {"input_per_mtok": 1.0, "cached_input_per_mtok": 1.0, "output_per_mtok": 2.0}},
            "ops": {"server_secret": "o" * 32,
                    "shared": {"redis_url": redis.url, "postgres_url": pg.url, "timeout_s": 5.0,
                               "outbox_dir": str(tmp)},
                    "tenants": [{"org": "o", "teams": [{"name": "t", "keys": [
                        {"name": "k", "key": key, "limits": {"budget_usd": 100.0}}]}]}]},
        }))
        replicas = start_replicas(config, [free_port()], tmp)
        try:
            yield OneReplica(replicas[0], pg, key, redis.url, config)
        finally:
            stop_all(replicas)


def test_postgres_stopped_requests_are_served_and_drained_exactly_once(fleet: OneReplica) -> None:
    assert fleet.chat("ob-before").status_code == 200
    assert fleet.outbox()["depth"] == 0
    fleet.pg.stop(remove=False)
    try:
        for i in range(5):
            r = fleet.chat(f"ob-down-{i}")
            assert r.status_code == 200, r.text
        assert fleet.outbox()["depth"] == 5  # on the replica's disk before each client saw completion
        metrics = httpx.get(f"{fleet.replica.url}/metrics", timeout=10.0).text
        assert "tokenomy_gateway_ledger_outbox_depth 5.0" in metrics
        assert "tokenomy_gateway_ledger_outbox_oldest_age_seconds" in metrics
    finally:
        fleet.pg.start()
    wait_for(lambda: fleet.outbox()["depth"] == 0, timeout_s=60.0, interval_s=0.2, what="the outbox drained")
    ids = fleet.ledger_ids("ob-")
    assert sorted(ids) == sorted(["ob-before"] + [f"ob-down-{i}" for i in range(5)])  # each exactly once
    assert fleet.chat("ob-after").status_code == 200
    assert fleet.outbox() == {"depth": 0, "oldest_age_s": 0.0}
    # outboxed events settle without a ledger transaction id: their spend counted once, not twice
    wait_for(lambda: len({round(x, 9) for x in fleet.spend()}) == 1, timeout_s=10.0, what="spend settled")
    assert fleet.spend()[1] > 0


def test_a_replica_killed_with_a_queue_drains_it_when_restarted(fleet: OneReplica,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    fleet.pg.stop(remove=False)
    try:
        for i in range(3):
            r = fleet.chat(f"rs-down-{i}")
            assert r.status_code == 200, r.text
        assert fleet.outbox()["depth"] == 3
        fleet.replica.kill()  # dies with its queue on disk
    finally:
        fleet.pg.start()
    assert fleet.ledger_ids("rs-") == []
    assert main(["usage", "--config", str(fleet.config), "--by", "key"]) == 0  # PostgreSQL's ledger, and a word
    out = " ".join(capsys.readouterr().out.split())
    assert "3 usage events" in out and "not yet in PostgreSQL" in out and str(fleet.config.parent) in out
    fleet.replica.start().wait_ready()  # the same disk: its first outbox file again
    wait_for(lambda: sorted(fleet.ledger_ids("rs-")) == [f"rs-down-{i}" for i in range(3)], timeout_s=60.0,
             interval_s=0.2, what="the dead replica's queue drained")
    assert fleet.outbox()["depth"] == 0


def test_a_replica_restarted_while_postgres_is_down_serves_from_its_tenant_snapshot(fleet: OneReplica) -> None:
    snapshot = fleet.config.parent / TENANT_SNAPSHOT
    assert snapshot.exists() and snapshot.stat().st_mode & 0o077 == 0  # written at start-up, private
    assert fleet.key not in snapshot.read_text()  # digests, never the raw key
    fleet.pg.stop(remove=False)
    try:
        fleet.replica.kill()
        fleet.replica.start().wait_ready()  # no PostgreSQL: the tree comes from the snapshot
        r = fleet.chat("snap-down-0")
        assert r.status_code == 200, r.text
        refused = httpx.post(f"{fleet.replica.url}/v1/chat/completions", timeout=30.0,
                             json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                             headers={"authorization": "Bearer tk-not-a-key"})
        assert refused.status_code == 401
        assert fleet.outbox()["depth"] == 1
    finally:
        fleet.pg.start()
    wait_for(lambda: fleet.ledger_ids("snap-") == ["snap-down-0"], timeout_s=60.0, interval_s=0.2,
             what="the outbox drained once PostgreSQL was back")
    assert fleet.chat("snap-after").status_code == 200


def test_a_replica_that_cannot_reach_postgres_at_start_up_says_so_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "backends": [{"id": "b1", "url": "http://127.0.0.1:9"}],
        "ops": {"server_secret": "o" * 32, "shared": {
            "redis_url": f"redis://127.0.0.1:{free_port()}/0", "outbox_dir": str(tmp_path),
            "postgres_url": f"postgresql+asyncpg://tokenomy@127.0.0.1:{free_port()}/postgres"}}}))
    done = subprocess.run([sys.executable, "-m", "tokenomy.gateway", "--config", str(config), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "PostgreSQL did not answer at start-up" in line and str(tmp_path) in line
