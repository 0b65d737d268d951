"""Token operations through the real gateway app and a fake upstream on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.gateway_core_support import MODEL, FakeUpstream, serve
from helpers.ops_factory import SECRET
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageFilter
from tokenomy.gateway.ops.budget import period_key
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration

PRICE = {"input_per_mtok": 1.0, "cached_input_per_mtok": 0.25, "output_per_mtok": 2.0}
PROMPT = "abcdefg " * 50  # 400 characters: the request path estimates 100 tokens; the upstream counts 51
MAX_TOKENS = 20
WORST_USD = (100 * 1.0 + MAX_TOKENS * 2.0) / 1e6


class Rig:
    def __init__(self, url: str, upstream: FakeUpstream, ledger: SqlLedger, app: Any, keys: dict[str, str]):
        self.url, self.upstream, self.ledger, self.app, self.keys = url, upstream, ledger, app, keys


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    keys = {"a": new_api_key(), "b": new_api_key()}
    upstream = FakeUpstream()
    with serve(upstream.app()) as up_url:
        cfg = config_from_dict({
            "backends": [{"id": "b1", "url": up_url}],
            "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
            "prices": {MODEL: PRICE},
            "ops": {"server_secret": SECRET, "admin_key": "admin-" + "z" * 20,
                    "breaker": {"repeat_limit": None},
                    "tenants": [
                        {"org": "acme", "teams": [{"name": "ml", "keys": [
                            {"name": "a", "key": keys["a"], "limits": {"budget_usd": 50 * WORST_USD}}]}]},
                        {"org": "other", "teams": [{"name": "x", "keys": [
                            {"name": "b", "key": keys["b"], "limits": {"rpm": 1000, "tpm": 10**6}}]}]},
                    ]},
        })
        ledger = SqlLedger(cfg.ledger.url)
        app = build_app(cfg, ledger=ledger)
        try:
            with serve(app) as url:
                yield Rig(url, upstream, ledger, app, keys)
        finally:
            ledger.close()


def chat_body() -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS}


def test_budget_race_through_the_app(rig: Rig) -> None:
    """200 concurrent requests on a key whose budget fits 50 worst cases: spend <= budget, each request
    served or refused with budget_exceeded, and the ledger's sum equals the backend's usage."""

    async def main() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=rig.url, timeout=60, limits=limits) as client:
            headers = {"authorization": f"Bearer {rig.keys['a']}"}
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=chat_body(), headers=headers)
                                          for _ in range(200)))

    responses = asyncio.run(main())
    served = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert {(r.status_code, r.json()["error"]["code"]) for r in refused} == {(429, "budget_exceeded")}
    assert len(served) >= 50  # all 200 arrive before any settles: exactly 50 worst cases fit
    events = rig.ledger.query(UsageFilter())
    assert len(events) == len(served) == len(rig.upstream.usages)
    budget = 50 * WORST_USD
    ledger_usd = sum(e.cost_usd for e in events)
    assert ledger_usd <= budget + 1e-12
    backend_usd = sum(((u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]) * 1.0
                       + u["prompt_tokens_details"]["cached_tokens"] * 0.25
                       + u["completion_tokens"] * 2.0) / 1e6 for u in rig.upstream.usages)
    assert ledger_usd == pytest.approx(backend_usd, abs=1e-12)
    guard = rig.app.state.guard
    key_id = events[0].key_id
    spent, held = guard.state.reservations.usage((key_id, period_key("month", guard.clock())))  # the embedded state
    assert spent == pytest.approx(ledger_usd, abs=1e-12) and held == pytest.approx(0.0, abs=1e-12)


def test_bad_and_revoked_keys_and_usage_isolation(rig: Rig) -> None:
    with httpx.Client(base_url=rig.url, timeout=10) as http:
        for auth in (None, "Bearer tk-nope", "Bearer " + new_api_key()):
            r = http.post("/v1/chat/completions", json=chat_body(), headers={"authorization": auth} if auth else {})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        for name in ("a", "b"):
            r = http.post("/v1/chat/completions", json=chat_body(),
                          headers={"authorization": f"Bearer {rig.keys[name]}"})
            assert r.status_code == 200
            assert ("x-ratelimit-limit-requests" in r.headers) == (name == "b")  # only b sets limits
        assert r.headers["x-ratelimit-limit-requests"] == "1000"
        assert r.headers["x-ratelimit-remaining-requests"] == "999"
        assert r.headers["x-ratelimit-limit-tokens"] == str(10**6)
        usage_a = http.get("/v1/usage", headers={"authorization": f"Bearer {rig.keys['a']}"})
        assert usage_a.status_code == 200
        guard = rig.app.state.guard
        key_b = guard.store.authenticate(rig.keys["b"]).id
        assert key_b not in usage_a.text
        # the admin revokes b; its very next request is refused
        admin = {"authorization": "Bearer admin-" + "z" * 20}
        assert http.post(f"/admin/keys/{key_b}/revoke", headers=admin).status_code == 200
        r = http.post("/v1/chat/completions", json=chat_body(), headers={"authorization": f"Bearer {rig.keys['b']}"})
        assert r.status_code == 401


def test_a_reused_request_id_is_refused_and_charges_nothing(rig: Rig) -> None:
    """409 for an id already recorded or in flight; the budget is charged once per served id."""
    guard = rig.app.state.guard
    headers = {"authorization": f"Bearer {rig.keys['a']}", "x-request-id": "once"}

    def budget() -> tuple[float, float]:
        key_id = guard.store.authenticate(rig.keys["a"]).id
        return guard.state.reservations.usage((key_id, period_key("month", guard.clock())))  # the embedded state

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=rig.url, timeout=30) as client:
            first = await client.post("/v1/chat/completions", json=chat_body(), headers=headers)
            assert first.status_code == 200
            spent = budget()
            again = await client.post("/v1/chat/completions", json=chat_body(), headers=headers)
            assert (again.status_code, again.json()["error"]["code"]) == (409, "duplicate_request_id")
            assert budget() == spent
            rig.upstream.response_delay_s = 0.3  # the first twin is still in flight when the others arrive
            twins = {**headers, "x-request-id": "twin"}
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=chat_body(), headers=twins)
                                          for _ in range(5)))

    twins = asyncio.run(main())
    assert sorted(r.status_code for r in twins) == [200, 409, 409, 409, 409]
    events = {e.request_id: e for e in rig.ledger.query(UsageFilter())}
    assert sorted(events) == ["once", "twin"] and len(rig.upstream.usages) == 2
    spent, held = budget()
    assert spent == pytest.approx(events["once"].cost_usd + events["twin"].cost_usd, abs=1e-12)
    assert held == pytest.approx(0.0, abs=1e-12)


def test_an_unknown_caller_is_refused_before_its_body_or_request_id_is_looked_at(rig: Rig) -> None:
    """Authentication comes first: a caller without a valid key gets 401 whatever it sends, and
    cannot learn that a request id exists (409), that a model is unknown (404) or that its JSON
    is broken (400); the key's holder gets those answers."""
    good = {"authorization": f"Bearer {rig.keys['a']}"}
    with httpx.Client(base_url=rig.url, timeout=10) as http:
        assert http.post("/v1/chat/completions", json=chat_body(), headers={**good, "x-request-id": "known"}
                         ).status_code == 200
        probes = [
            {"json": chat_body(), "headers": {"x-request-id": "known"}},
            {"json": {**chat_body(), "model": "no-such-model"}, "headers": {}},
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
        ]
        for auth in ({}, {"authorization": "Bearer tk-" + "x" * 43}):
            for probe in probes:
                r = http.post("/v1/chat/completions", content=probe.get("content"), json=probe.get("json"),
                              headers={**probe["headers"], **auth})
                assert (r.status_code, r.json()["error"]["type"]) == (401, "authentication_error"), probe
        codes = [http.post("/v1/chat/completions", content=p.get("content"), json=p.get("json"),
                           headers={**p["headers"], **good}).status_code for p in probes]
        assert codes == [409, 404, 400]


def test_the_hold_covers_every_choice_and_an_absurd_max_tokens_is_refused(rig: Rig) -> None:
    """n = 64 asks the backend for 64 answers: the hold is for 64 x max_tokens, so a budget that
    pays for one answer refuses it rather than letting it spend 64 times what was held."""
    headers = {"authorization": f"Bearer {rig.keys['a']}"}
    guard = rig.app.state.guard
    with httpx.Client(base_url=rig.url, timeout=10) as http:
        one = http.post("/v1/chat/completions", json={**chat_body(), "max_tokens": 100}, headers=headers)
        assert one.status_code == 200
        many = http.post("/v1/chat/completions", json={**chat_body(), "max_tokens": 100, "n": 64}, headers=headers)
        assert (many.status_code, many.json()["error"]["code"]) == (429, "budget_exceeded")
        fits = http.post("/v1/chat/completions", json={**chat_body(), "max_tokens": 10, "n": 4}, headers=headers)
        assert fits.status_code == 200
        assert rig.upstream.bodies[-1]["max_tokens"] == 10 and rig.upstream.bodies[-1]["n"] == 4  # per choice
        huge = http.post("/v1/chat/completions", json={**chat_body(), "max_tokens": 9 * 10**18}, headers=headers)
        err = huge.json()["error"]
        assert (huge.status_code, err["code"], err["param"]) == (400, "max_tokens_too_large", "max_tokens")
        bad_n = http.post("/v1/chat/completions", json={**chat_body(), "n": 1000}, headers=headers)
        assert (bad_n.status_code, bad_n.json()["error"]["param"]) == (400, "n")
    key_id = guard.store.authenticate(rig.keys["a"]).id
    spent, held = guard.state.reservations.usage((key_id, period_key("month", guard.clock())))  # the embedded state
    assert held == pytest.approx(0.0, abs=1e-12) and len(rig.upstream.usages) == 2
