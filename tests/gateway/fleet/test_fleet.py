"""Three ``tokenomy serve`` replicas sharing one real redis-server and one PostgreSQL, requests spread
round-robin, a fast fake upstream behind them: every promise of token operations holds across the
fleet as through one replica, through a replica's SIGKILL, a Redis restart and a PostgreSQL stop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from redis import Redis

from helpers.gateway_core_support import MODEL, FakeUpstream, serve
from helpers.servers import postgres_server, redis_server
from tokenomy.gateway.http.replicas import Replica, start_replicas, stop_all
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.ops.tenancy import NodeLimits
from tokenomy.gateway.stores.pg_tenancy import pg_engine
from tokenomy.gateway.stores.servers import PostgresServer, RedisServer, free_port

pytestmark = pytest.mark.integration
SECRET = "f" * 32
ADMIN = "admin-" + "f" * 20
LEASE_S = 2.0
KEY_LIMITS: dict[str, dict[str, Any]] = {
    "tpm1": {"tpm": 10_000, "rpm": 60}, "tpm3": {"tpm": 10_000, "rpm": 60},
    "rpm3": {"rpm": 60},
    "budget": {"budget_usd": 0.1015},  # 50 requests of ~$0.002 (max_tokens 1000 at $2/M)
    "kill": {}, "agent": {},
    "outage_b": {"budget_usd": 100.0}, "outage_u": {},
}


@dataclass
class Fleet:
    replicas: list[Replica]
    redis: RedisServer
    pg: PostgresServer
    upstream: FakeUpstream
    keys: dict[str, str]  # name -> raw key

    def url(self, i: int) -> str:
        return self.replicas[i % len(self.replicas)].url

    def key_id(self, name: str) -> str:
        with pg_engine(self.pg.url).connect() as conn:
            return str(conn.execute(sa.text("SELECT id FROM tk_nodes WHERE name = :n"), {"n": name}).scalar_one())

    def ledger(self, key_name: str) -> list[tuple[str, float, int]]:
        """(request id, cost, prompt + output tokens) of the key's ledger events."""
        with pg_engine(self.pg.url).connect() as conn:
            rows = conn.execute(sa.text("SELECT request_id, cost_usd, prompt_tokens + output_tokens FROM usage_events "
                                        "WHERE key_id = :k"), {"k": self.key_id(key_name)}).all()
        return [(str(r[0]), float(r[1]), int(r[2])) for r in rows]

    def spent(self, key_name: str) -> tuple[float, float]:
        """The guard's (spent, reserved) for the key this month, from Redis."""
        r = Redis.from_url(self.redis.url)
        try:
            keys = r.keys(f"tk:bu:{self.key_id(key_name)}:*")
            assert len(keys) == 1
            spent, reserved = r.hmget(keys[0], ["spent", "reserved"])
            return float(spent or 0.0), float(reserved or 0.0)
        finally:
            r.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    upstream = FakeUpstream()
    keys = {name: new_api_key() for name in KEY_LIMITS}
    with redis_server(tmp) as redis, postgres_server() as pg, serve(upstream.app()) as up_url:
        config = tmp / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "backends": [{"id": "b1", "url": up_url}],
            "prices": {MODEL: {"input_per_mtok": 1.0, "cached_input_per_mtok": 1.0, "output_per_mtok": 2.0}},
            "ops": {"server_secret": SECRET, "admin_key": ADMIN,
                    "shared": {"redis_url": redis.url, "postgres_url": pg.url, "lease_s": LEASE_S, "timeout_s": 5.0,
                               "on_outage": {"ledger": "refuse"}, "outbox_dir": str(tmp)},  # the outbox: test_fleet_outbox.py
                    "breaker": {"max_turns_per_session": 6},
                    "tenants": [{"org": "o", "teams": [{"name": "t", "keys": [
                        {"name": n, "key": keys[n], "limits": NodeLimits(**lim).model_dump(exclude_defaults=True)}
                        for n, lim in KEY_LIMITS.items()]}]}]},
        }))
        replicas = start_replicas(config, [free_port() for _ in range(3)], tmp)
        try:
            yield Fleet(replicas, redis, pg, upstream, keys)
        finally:
            stop_all(replicas)


def chat(url: str, key: str, rid: str, max_tokens: int = 10, content: str = "hello", session: str | None = None,
         stream: bool = False, timeout: float = 30.0) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "x-request-id": rid}
    if session:
        headers["x-session-id"] = session
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": stream}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=timeout)


def burst_tokens(fleet: Fleet, key: str, replicas: int, tag: str, tpm: int = 10_000) -> float:
    """Tokens served to ``key`` from requests sent back to back through ``replicas`` replicas until
    the first 429, less what the bucket refilled meanwhile (``tpm`` a minute): the burst it held."""
    served = 0
    t0 = time.monotonic()
    for i in range(200):
        r = chat(fleet.url(i % replicas), fleet.keys[key], f"{tag}-{i}", max_tokens=500)
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "rate_limit_tpm"
            return served - (time.monotonic() - t0) * tpm / 60.0
        assert r.status_code == 200, r.text
        served += r.json()["usage"]["total_tokens"]
    raise AssertionError("never limited")


def test_tpm_and_rpm_across_the_fleet_are_those_of_one_replica(fleet: Fleet) -> None:
    one = burst_tokens(fleet, "tpm1", 1, "tpm1")
    three = burst_tokens(fleet, "tpm3", 3, "tpm3")
    per_request = 502  # "user: hello" + 500 answer tokens
    assert 10_000 - 2 * per_request <= one <= 10_000 + per_request, one
    assert abs(three - one) <= per_request, (one, three)  # one replica's limit, not three times it
    t0 = time.monotonic()
    ok = sum(chat(fleet.url(i), fleet.keys["rpm3"], f"rpm3-{i}").status_code == 200 for i in range(75))
    elapsed = time.monotonic() - t0
    assert 60 <= ok <= 60 + int(elapsed) + 1, (ok, elapsed)  # 60 a minute, refilling 1 a second


def test_200_concurrent_requests_over_3_replicas_on_a_50_request_budget(fleet: Fleet) -> None:
    fleet.upstream.response_delay_s = 0.3
    before = len(fleet.upstream.usages)

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"q{i:03d}"}], "max_tokens": 1000}
        r = await client.post(f"{fleet.url(i)}/v1/chat/completions", json=body, timeout=60,
                              headers={"authorization": f"Bearer {fleet.keys['budget']}", "x-request-id": f"b-{i}"})
        assert r.status_code == 200 or r.json()["error"]["code"] == "budget_exceeded", r.text
        return r.status_code

    async def main() -> list[int]:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=250)) as client:
            return await asyncio.gather(*(one(client, i) for i in range(200)))

    try:
        statuses = asyncio.run(main())
    finally:
        fleet.upstream.response_delay_s = 0.0
    assert statuses.count(200) == 50
    usages = fleet.upstream.usages[before:]
    backend_usd = sum(u["prompt_tokens"] * 1e-6 + u["completion_tokens"] * 2e-6 for u in usages)
    ledger_usd = sum(cost for _, cost, _ in fleet.ledger("budget"))
    spent, reserved = fleet.spent("budget")
    assert len(usages) == 50
    assert round(ledger_usd, 9) == round(backend_usd, 9) == round(spent, 9) and reserved == pytest.approx(0.0, abs=1e-12)
    # every replica's admin API and budget gauges show the fleet's spend (the shared store), not
    # what went through that replica
    key_id = fleet.key_id("budget")
    for i in range(3):
        shown = httpx.get(f"{fleet.url(i)}/admin/budget/{key_id}", headers={"authorization": f"Bearer {ADMIN}"}).json()
        assert round(shown["spent_usd"], 9) == round(spent, 9) and shown["reserved_usd"] == pytest.approx(0.0, abs=1e-12)
    gauge = next(line for line in httpx.get(f"{fleet.url(2)}/metrics").text.splitlines()
                 if line.startswith("tokenomy_gateway_budget_spent_usd{") and f'node="{key_id}"' in line)
    assert round(float(gauge.rsplit(" ", 1)[1]), 9) == round(spent, 9)


def test_sigkill_one_replica_mid_load(fleet: Fleet) -> None:
    fleet.upstream.token_delay_s = 0.02
    done: dict[str, int] = {}  # request id -> replica
    errors: list[str] = []
    started: set[str] = set()

    def client(i: int) -> None:
        rid, replica = f"kill-{i}", i % 3
        try:
            with httpx.stream("POST", f"{fleet.url(replica)}/v1/chat/completions", timeout=30,
                              json={"model": MODEL, "messages": [{"role": "user", "content": f"k{i}"}],
                                    "max_tokens": 5 if i % 2 == 0 else 100, "stream": True},
                              headers={"authorization": f"Bearer {fleet.keys['kill']}", "x-request-id": rid}) as r:
                text = ""
                for chunk in r.iter_text():
                    started.add(rid)
                    text += chunk
            if r.status_code == 200 and "[DONE]" in text and '"error"' not in text:
                done[rid] = replica
            elif replica != 1:
                errors.append(f"{rid}: {r.status_code} {text[-200:]}")
        except httpx.HTTPError as e:
            if replica != 1:  # only the killed replica's clients may see their connection die
                errors.append(f"{rid}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(36)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # kill once some finished and the victim streams others
            if done and {r for r in started if int(r.split("-")[1]) % 3 == 1} - set(done):
                break
            time.sleep(0.01)
        fleet.replicas[1].kill()
        killed_at = time.monotonic()
        victims = {r for r in started if int(r.split("-")[1]) % 3 == 1} - set(done)  # streaming when it died
        held_right_after = len(Redis.from_url(fleet.redis.url).zrange("tk:holds", 0, -1))
        for t in threads:
            t.join(60)
        deadline = killed_at + LEASE_S * 3 + 5  # a survivor's heartbeat reclaims them
        while time.monotonic() < deadline and Redis.from_url(fleet.redis.url).zcard("tk:holds"):
            time.sleep(0.2)
        holds_left = Redis.from_url(fleet.redis.url).zcard("tk:holds")
    finally:
        fleet.upstream.token_delay_s = 0.0
        fleet.replicas[1].start().wait_ready()
    assert not errors, errors
    ledger = fleet.ledger("kill")
    ids = [rid for rid, _, _ in ledger]
    assert set(done) <= set(ids) and len(ids) == len(set(ids))
    assert victims and held_right_after > 0, "the kill came after every request finished: nothing was tested"
    assert holds_left == 0
    spent, reserved = fleet.spent("kill")
    assert round(spent, 9) == round(sum(c for _, c, _ in ledger), 9) and reserved == pytest.approx(0.0, abs=1e-12)


def agent_cut_at(fleet: Fleet, replicas: int, session: str) -> tuple[int, str]:
    for turn in range(1, 20):
        r = chat(fleet.url(turn % replicas), fleet.keys["agent"], f"{session}-{turn}", session=session,
                 content=f"tool result {turn}")
        if r.status_code != 200:
            return turn, r.json()["error"]["code"]
    raise AssertionError("never cut")


def test_a_runaway_agent_over_3_replicas_is_cut_at_the_same_turn_as_through_one(fleet: Fleet) -> None:
    assert agent_cut_at(fleet, 1, "agent-one") == agent_cut_at(fleet, 3, "agent-three") == (7, "breaker_turn_cap")


def load(fleet: Fleet, tag: str, seconds: float, during: Any) -> list[tuple[str, str, int, dict[str, Any]]]:
    """Requests from a budgeted and an unbudgeted key, round-robin, while ``during()`` runs."""
    out: list[tuple[str, str, int, dict[str, Any]]] = []
    stop = threading.Event()

    def client(key: str) -> None:
        i = 0
        while not stop.is_set() and i < 400:
            rid = f"{tag}-{key}-{i}"
            try:
                r = chat(fleet.url(i), fleet.keys[key], rid, timeout=20)
                out.append((key, rid, r.status_code, dict(r.headers) | ({} if r.status_code == 200 else r.json())))
            except httpx.HTTPError as e:
                out.append((key, rid, -1, {"error": repr(e)}))
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in ("outage_b", "outage_u")]
    for t in threads:
        t.start()
    try:
        time.sleep(seconds / 3)
        during()
        time.sleep(seconds / 3)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    return out


def test_redis_restarted_mid_load(fleet: Fleet) -> None:
    results = load(fleet, "redis", 3.0, fleet.redis.restart)
    for key, rid, status, info in results:
        if status != 200:  # budgeted keys fail closed while Redis is away; unbudgeted are served locally
            assert key == "outage_b" and status == 503, (rid, status, info)
            assert info["error"]["code"] == "store_unavailable" and int(info["retry-after"]) >= 1
    ids = {rid for rid, _, _ in fleet.ledger("outage_b")} | {rid for rid, _, _ in fleet.ledger("outage_u")}
    assert {rid for _, rid, status, _ in results if status == 200} <= ids
    assert sum(status == 200 for k, _, status, _ in results if k == "outage_u") == sum(k == "outage_u" for k, *_ in results)
    time.sleep(0.5)
    spent, reserved = fleet.spent("outage_b")  # rebuilt from the ledger, then every later settle: exact
    assert round(spent, 9) == round(sum(c for _, c, _ in fleet.ledger("outage_b")), 9)


def test_postgres_stopped_mid_load(fleet: Fleet) -> None:
    def outage() -> None:
        fleet.pg.stop(remove=False)
        time.sleep(1.0)
        fleet.pg.start()

    before = {rid for rid, _, _ in fleet.ledger("outage_b")}
    results = load(fleet, "pg", 4.5, outage)
    allowed = {"ledger_write_failed", "ledger_unavailable"}
    for _, rid, status, info in results:
        if status != 200:  # no completion the ledger does not hold: the request fails instead
            assert status in (500, 503) and info["error"]["code"] in allowed, (rid, status, info)
    assert any(status != 200 for _, _, status, _ in results), "PostgreSQL's stop was not seen: nothing was tested"
    ids = {rid for rid, _, _ in fleet.ledger("outage_b")} | {rid for rid, _, _ in fleet.ledger("outage_u")}
    assert {rid for _, rid, status, _ in results if status == 200} <= ids | before
    for i in range(10):  # served again once PostgreSQL is back, after the retry-after it asked for
        r = chat(fleet.url(i), fleet.keys["outage_b"], f"pg-after-{i}")
        if r.status_code == 200:
            break
        time.sleep(float(r.headers["retry-after"]))
    assert r.status_code == 200, r.text
