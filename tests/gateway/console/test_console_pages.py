"""The console's pages, sign-in and forms through Starlette's test client, on a real guard
(SQLite tenant store) and a real ledger, with a fake clock; and its ledger queries."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from helpers.ops_factory import T0, FakeClock, make_guard
from tokenomy.gateway.console import ConsoleDeps, ConsoleQueries, build_console
from tokenomy.gateway.console.auth import SESSION_TTL_S
from tokenomy.gateway.console.queries import PAGE_ROWS
from tokenomy.gateway.metering.ledger import UsageEvent
from tokenomy.gateway.ops.breaker import BreakerConfig, Breakers
from tokenomy.gateway.ops.tenancy import NodeKind, NodeLimits
from tokenomy.gateway.routing.ampd_counts import BUCKET_S, BUCKETS, AmpdCounts
from tokenomy.gateway.stores.ledger_sql import SqlLedger

ADMIN = "admin-" + "k" * 24


def event(rid: str, ts_s: float, path: str, session: str, turn: int = 0, cost: float = 0.001) -> UsageEvent:
    key = path.split("/")[-1]
    return UsageEvent(rid, ts_s, path, key, "m", "b1", "chat", False, 200, "ok", session, turn, 100, 100 if turn == 0
                      else 10, 0 if turn == 0 else 10, 0 if turn == 0 else 80, 20, 60, 40, cost / 2, cost / 4, cost / 4,
                      cost, cost / 3, 0.1, 0.01, 0.5)


@dataclass
class Rig:
    client: TestClient
    guard: Any
    ledger: SqlLedger
    clock: FakeClock
    team_id: str
    key_id: str
    org_id: str


@dataclass
class _Pool:
    backends: list[Any] = field(default_factory=list)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, admin_key=ADMIN)
    org = guard.store.create_node(NodeKind.ORG, "acme", None, NodeLimits(budget_usd=10.0))
    team = guard.store.create_node(NodeKind.TEAM, "agents", org.id)
    key, _raw = guard.store.create_key(team.id, "ci-bot")
    ledger = SqlLedger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.record_sync([event(f"r{i}", T0 - 60 + i, f"{org.id}/{team.id}/{key.id}", "s1", i) for i in range(3)])
    app = Starlette(routes=[Mount("/console", build_console(ConsoleDeps(guard, ConsoleQueries(ledger.engine),
                                                                            _Pool())))])
    try:
        with TestClient(app, base_url="http://testserver/console", follow_redirects=False) as client:
            yield Rig(client, guard, ledger, clock, team.id, key.id, org.id)
    finally:
        ledger.close()


def login(rig: Rig) -> str:
    r = rig.client.post("/login", data={"admin_key": ADMIN})
    assert r.status_code == 303 and r.headers["location"].endswith("/tenants")
    page = rig.client.get("/tenants")
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert match is not None
    return match.group(1)


def test_pages_need_a_session_and_login_takes_only_the_admin_key(rig: Rig) -> None:
    for path in ("/tenants", "/spend", "/live", "/cluster", "/session?key=a&id=b"):
        r = rig.client.get(path)
        assert (r.status_code, r.headers["location"]) == (303, "/console/login"), path
    r = rig.client.post("/login", data={"admin_key": "tk-not-it"})
    assert r.status_code == 401 and "not the admin key" in r.text and "set-cookie" not in r.headers
    r = rig.client.post("/login", data={"admin_key": ADMIN})
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    assert rig.client.get("/tenants").status_code == 200


def test_a_session_expires(rig: Rig) -> None:
    login(rig)
    rig.clock.advance(SESSION_TTL_S + 1)
    assert rig.client.get("/tenants").status_code == 303


def test_a_forged_cookie_is_refused(rig: Rig) -> None:
    rig.client.cookies.set("tokenomy_console", f"{int(T0 + 3600)}.nonce.{'0' * 64}")
    assert rig.client.get("/tenants").status_code == 303


def test_forms_refuse_a_missing_token_or_another_origin(rig: Rig) -> None:
    csrf = login(rig)
    before = len(rig.guard.store.tree.nodes())
    r = rig.client.post("/tenants/keys", data={"team_id": rig.team_id, "name": "x"})
    assert r.status_code == 403
    r = rig.client.post("/tenants/keys", data={"team_id": rig.team_id, "name": "x", "csrf": csrf},
                        headers={"origin": "http://evil.example"})
    assert r.status_code == 403
    assert len(rig.guard.store.tree.nodes()) == before


def test_create_key_budget_and_revoke_through_the_store(rig: Rig) -> None:
    csrf = login(rig)
    r = rig.client.post("/tenants/keys", data={"team_id": rig.team_id, "name": "new", "budget_usd": "2.5",
                                               "csrf": csrf})
    raw = re.search(r'id="new_key_value">([^<]+)<', r.text)
    assert r.status_code == 200 and raw is not None
    node = rig.guard.store.authenticate(raw.group(1))
    assert node is not None and node.name == "new" and node.limits.budget_usd == 2.5

    r = rig.client.post(f"/tenants/{node.id}/budget", data={"budget_usd": "50", "csrf": csrf})
    assert r.status_code == 400 and "exceeds" in r.text  # above the org's $10
    assert rig.guard.store.tree.get(node.id).limits.budget_usd == 2.5
    r = rig.client.post(f"/tenants/{node.id}/budget", data={"budget_usd": "abc", "csrf": csrf})
    assert r.status_code == 400
    r = rig.client.post(f"/tenants/{node.id}/budget", data={"budget_usd": "1.25", "csrf": csrf})
    assert r.status_code == 303 and rig.guard.store.tree.get(node.id).limits.budget_usd == 1.25
    r = rig.client.post(f"/tenants/{node.id}/budget", data={"budget_usd": "", "csrf": csrf})
    assert r.status_code == 303 and rig.guard.store.tree.get(node.id).limits.budget_usd is None

    r = rig.client.post(f"/tenants/{node.id}/revoke", data={"csrf": csrf})
    assert r.status_code == 303 and rig.guard.store.authenticate(raw.group(1)) is None
    assert rig.client.post("/tenants/key_nope/revoke", data={"csrf": csrf}).status_code == 404


def test_tree_rolls_spend_up_from_the_ledger(rig: Rig) -> None:
    login(rig)
    page = rig.client.get("/tenants").text
    org_row = re.search(r'<tr class="org[^"]*" data-id="' + rig.org_id + r'".*?</tr>', page, re.S)
    assert org_row is not None and "$0.0030" in org_row.group(0) and "$10.0000 / month" in org_row.group(0)


def test_spend_session_live_and_cluster_pages_show_the_ledger(rig: Rig) -> None:
    login(rig)
    spend = rig.client.get("/spend?window=1h")
    assert spend.status_code == 200 and "$0.0030" in spend.text and "acme / agents / ci-bot" in spend.text
    assert spend.text.count("<svg") >= 4
    session = rig.client.get(f"/session?key={rig.key_id}&id=s1")
    assert session.status_code == 200 and session.text.count("<tr><td class=\"num\">") == 3
    assert rig.client.get(f"/session?key={rig.key_id}&id=nope").status_code == 404
    live = rig.client.get("/live")
    assert live.status_code == 200 and ">s1<" in live.text and "b1" in live.text
    cluster = rig.client.get("/cluster")
    assert cluster.status_code == 200 and "not in AMPD mode" in cluster.text


def test_console_is_off_without_an_admin_key(tmp_path: Path) -> None:
    guard = make_guard(tmp_path)
    ledger = SqlLedger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        app = build_console(ConsoleDeps(guard, ConsoleQueries(ledger.engine), _Pool()))
        with TestClient(app, follow_redirects=False) as client:
            assert client.get("/login").status_code == 404
            assert client.post("/login", data={"admin_key": ""}).status_code == 401
    finally:
        ledger.close()


def test_sessions_paginate_by_cost(tmp_path: Path) -> None:
    ledger = SqlLedger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        n = 2 * PAGE_ROWS + 10
        ledger.record_sync([event(f"r{i}", T0 + i, "o/t/k", f"s{i:03d}", cost=0.001 * (i + 1)) for i in range(n)])
        q = ConsoleQueries(ledger.engine)
        q.prepare()
        pages = [q.top_sessions(T0, p) for p in range(3)]
        assert [len(p.rows) for p in pages] == [PAGE_ROWS, PAGE_ROWS, 10]
        assert [p.has_next for p in pages] == [True, True, False]
        ids = [r.session_id for p in pages for r in p.rows]
        assert ids == [f"s{i:03d}" for i in reversed(range(n))]  # most expensive first, each once
        recent = q.recent_sessions(T0 + n - 5)
        assert [r.session_id for r in recent.rows] == [f"s{i:03d}" for i in reversed(range(n - 5, n))]
    finally:
        ledger.close()


def test_spend_buckets_by_time_and_path(tmp_path: Path) -> None:
    ledger = SqlLedger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        base = event("x", T0, "o/t/k", "s")
        ledger.record_sync([replace(base, request_id="a", ts_s=T0 + 5), replace(base, request_id="b", ts_s=T0 + 59),
                            replace(base, request_id="c", ts_s=T0 + 61, tenant_path="o/t/k2", key_id="k2"),
                            replace(base, request_id="d", ts_s=T0 + 200)])  # outside the window
        rows = ConsoleQueries(ledger.engine).spend(T0, T0 + 120, 60.0)
        got = {(r.bucket, r.tenant_path): (r.requests, round(sum(r.costs.values()), 9)) for r in rows}
        assert got == {(0, "o/t/k"): (2, 0.002), (1, "o/t/k2"): (1, 0.001)}
    finally:
        ledger.close()


def test_ampd_decisions_counted_and_bucketed_over_time() -> None:
    now = 10 * BUCKET_S * BUCKETS + 5.0
    decisions = [{"kind": "placement", "t_s": now - 1.0, "local": True},
                 {"kind": "placement", "t_s": now - BUCKET_S - 1.0, "local": False},
                 {"kind": "dispatch", "t_s": now - 0.5, "overtaken": 2, "prefill_instance": "p0"},
                 {"kind": "dispatch", "t_s": now - 0.4, "overtaken": 0, "prefill_instance": "p0"},
                 {"kind": "placement", "t_s": now - BUCKET_S * BUCKETS - 1, "local": True},  # too old to chart
                 {"kind": "binding", "t_s": now}]
    counts = AmpdCounts()
    for d in sorted(decisions, key=lambda d: d["t_s"]):
        counts.add(d)
    assert dict(counts.placements) == {"local": 2, "remote": 1}  # /metrics counts all
    assert (counts.prefill_reordered["p0"], counts.deferrals["p0"]) == (1, 2)
    starts, series = counts.series(now)
    assert len(starts) == BUCKETS and starts[-1] <= 0 < starts[-1] + BUCKET_S
    assert series["local prefill"] == [0] * (BUCKETS - 1) + [1]
    assert series["remote prefill"][-2:] == [1, 0]
    assert (series["reorders"][-1], series["deferrals"][-1]) == (1, 2)
    _later_starts, later = counts.series(now + BUCKET_S * BUCKETS)  # everything has aged out
    assert all(v == 0 for values in later.values() for v in values)


def test_breaker_session_status_reads_without_touching_lru_order() -> None:
    b = Breakers(BreakerConfig(repeat_limit=2, cooldown_s=30.0, max_sessions=2))
    assert b.session_status("k", "s", 0.0) is None
    b.admit_count("k", "s", "fp", 10, 0.01, 0.0)
    with pytest.raises(Exception, match="repeated"):
        b.admit_check("k", "s", "fp", 1.0)
    b.admit_count("k", "s2", None, 10, 0.01, 2.0)
    status = b.session_status("k", "s", 3.0)
    assert status is not None and status.open and status.code == "breaker_repetition" and status.turns == 1
    b.admit_count("k", "s3", None, 10, 0.01, 4.0)  # evicts the least recently used: "s" (the read did not touch it)
    assert b.session_status("k", "s", 5.0) is None and b.session_status("k", "s2", 5.0) is not None
    closed = b.session_status("k", "s2", 100.0)
    assert closed is not None and not closed.open and closed.code == ""


@dataclass
class _Outbox:
    depth: int

    def stats(self) -> dict[str, float | int]:
        return {"depth": self.depth, "oldest_age_s": 12.5 if self.depth else 0.0}


def test_cluster_shows_a_fleet_replicas_ledger_outbox(rig: Rig) -> None:
    login(rig)
    assert 'id="outbox"' not in rig.client.get("/cluster").text  # the embedded gateway has none
    outbox = _Outbox(7)
    deps = ConsoleDeps(rig.guard, ConsoleQueries(rig.ledger.engine), _Pool(), None, outbox)
    app = Starlette(routes=[Mount("/console", build_console(deps))])
    with TestClient(app, base_url="http://testserver/console", follow_redirects=False) as client:
        client.post("/login", data={"admin_key": ADMIN})
        page = client.get("/cluster").text
        assert re.search(r'id="outbox".*<span class="bad">7</span>.*12\.5 s', page, re.S)
        outbox.depth = 0
        assert re.search(r'id="outbox".*<span class="ok">0</span>', client.get("/cluster").text, re.S)
