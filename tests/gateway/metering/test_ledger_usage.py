"""Reading the ledger: GET /v1/usage (scope, filters, CSV) and `tokenomy usage`."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.gateway_core_support import MODEL, serve
from tokenomy.cli.main import main
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageEvent
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.stores.ledger_sql import SqlLedger


def _event(rid: str, tenant: str, session: str, ts: float, cost: float) -> UsageEvent:
    key = tenant.rsplit("/", 1)[-1]
    return UsageEvent(rid, ts, tenant, key, MODEL, "b1", "chat", False, 200, "ok", session, 0, 100, 100, 0, 0, 10,
                      40, 60, 0.0, 0.0, 0.0, cost, 1e-6, None, None, 0.1)


class ScopedGuard(AllowAllGuard):
    async def usage_scope(self, api_key: str | None) -> tuple[str, ...]:
        if api_key == "team1-key":
            return ("org", "team1")
        if api_key == "admin":
            return ()
        raise GatewayError(401, "invalid API key", "authentication_error", "invalid_api_key")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.db"
    ledger = SqlLedger(f"sqlite:///{path}")
    ledger.record_sync([
        _event("a", "org/team1/k1", "s1", 100.0, 0.5),
        _event("b", "org/team1/k2", "s2", 200.0, 0.25),
        _event("c", "org/team2/k3", "s3", 300.0, 1.0),
        _event("d", "org/team10/k4", "s4", 400.0, 2.0),
    ])
    ledger.close()
    return path


@pytest.fixture
def url(db: Path) -> Iterator[str]:
    cfg = config_from_dict({"backends": [{"id": "b1", "url": "http://127.0.0.1:9"}], "ledger": {"url": f"sqlite:///{db}"},
                            "health": {"interval_s": 60}})
    ledger = SqlLedger(cfg.ledger.url)
    try:
        with serve(build_app(cfg, guard=ScopedGuard(), ledger=ledger)) as u:
            yield u
    finally:
        ledger.close()


def _get(url: str, api_key: str | None, **params: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.get(url + "/v1/usage", params=params, headers=headers)


@pytest.mark.integration
def test_a_key_reads_only_its_own_subtree(url: str) -> None:
    r = _get(url, "team1-key")
    assert [e["request_id"] for e in r.json()["data"]] == ["a", "b"]  # not team10: a path, not a string prefix
    assert r.json()["totals"]["cost_usd"] == pytest.approx(0.75)
    forbidden = _get(url, "team1-key", tenant="org/team2")
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "outside_scope"
    assert _get(url, None).status_code == 401 and _get(url, "stolen").json()["error"]["type"] == "authentication_error"
    assert [e["request_id"] for e in _get(url, "admin", tenant="org/team2").json()["data"]] == ["c"]


@pytest.mark.integration
def test_filters_csv_and_bad_parameters(url: str) -> None:
    assert [e["request_id"] for e in _get(url, "admin", since="150", until="350").json()["data"]] == ["b", "c"]
    assert [e["request_id"] for e in _get(url, "admin", session="s4").json()["data"]] == ["d"]
    rows = list(csv.DictReader(io.StringIO(_get(url, "admin", format="csv", key="k1").text)))
    assert [(r["request_id"], r["cached_tokens"], r["ttft_s"]) for r in rows] == [("a", "40", "")]
    for params, param in (({"since": "yesterday"}, "since"), ({"format": "xml"}, "format"), ({"limit": "0"}, "limit")):
        r = _get(url, "admin", **params)
        assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_usage_cli_groups_and_writes_json(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "usage.json"
    assert main(["usage", "--db", str(db), "--by", "tenant", "--tenant", "org/team1", "--json", str(out)]) == 0
    groups = json.loads(out.read_text())["groups"]
    assert list(groups) == ["org/team1/k1", "org/team1/k2"]  # largest cost first
    assert groups["org/team1/k1"]["cached_tokens"] == 40 and groups["org/team1/k1"]["requests"] == 1
    assert "org/team1/k2" in capsys.readouterr().out
    assert main(["usage", "--db", str(db), "--since", "not-a-time"]) == 2
    assert "--since" in capsys.readouterr().err
    assert main(["usage", "--db", str(tmp_path / "none.db")]) == 2
