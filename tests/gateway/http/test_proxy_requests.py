"""The request path end to end on loopback: a fake upstream behind the real gateway app."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.gateway_core_support import MODEL, FakeUpstream, serve
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageFilter
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration


class Rig:
    def __init__(self, url: str, upstream: FakeUpstream, guard: AllowAllGuard, ledger: SqlLedger) -> None:
        self.url = url
        self.upstream = upstream
        self.guard = guard
        self.ledger = ledger
        self.http = httpx.Client(base_url=url, timeout=10)

    def events(self) -> list[Any]:
        return self.ledger.query(UsageFilter())


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    upstream = FakeUpstream()
    with serve(upstream.app()) as up_url:
        cfg = config_from_dict({
            "backends": [{"id": "b1", "url": up_url}],
            "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
            "server": {"max_body_bytes": 4096},
        })
        ledger = SqlLedger(cfg.ledger.url)
        guard = AllowAllGuard()
        try:
            with serve(build_app(cfg, guard=guard, ledger=ledger)) as url:
                r = Rig(url, upstream, guard, ledger)
                yield r
                r.http.close()
        finally:
            ledger.close()


def chat(content: str = "hello there", **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


def sse(text: str) -> list[Any]:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_chat_non_stream_is_passed_through_and_metered(rig: Rig) -> None:
    r = rig.http.post("/v1/chat/completions", json=chat(max_tokens=5), headers={"x-request-id": "r1"})
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "w0 w1 w2 w3 w4"
    assert r.headers["x-request-id"] == "r1"
    [ev] = rig.events()
    assert (ev.request_id, ev.backend, ev.status, ev.outcome) == ("r1", "b1", 200, "ok")
    assert (ev.prompt_tokens, ev.output_tokens) == (body["usage"]["prompt_tokens"], 5)
    assert ev.input_tokens == ev.prompt_tokens and ev.turn == 0
    assert ev.cost_usd > 0
    assert "r1" in rig.guard.settled and not rig.guard.open


def test_stream_without_usage_request_strips_usage_but_meters_it(rig: Rig) -> None:
    r = rig.http.post("/v1/chat/completions", json=chat(max_tokens=4, stream=True))
    assert r.status_code == 200
    events = sse(r.text)
    assert events[-1] == "[DONE]"
    assert all("usage" not in e or e["usage"] is None for e in events[:-1])
    assert "".join(e["choices"][0]["delta"]["content"] for e in events[:-1]) == "w0 w1 w2 w3"
    assert rig.upstream.bodies[-1]["stream_options"] == {"include_usage": True}
    [ev] = rig.events()
    assert ev.output_tokens == 4 and ev.stream and ev.ttft_s is not None and ev.tpot_s is not None


def test_stream_with_usage_request_gets_the_backends_usage(rig: Rig) -> None:
    r = rig.http.post("/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 3, "stream": True,
                                               "stream_options": {"include_usage": True}})
    events = sse(r.text)
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert usage == rig.upstream.usages[-1]
    [ev] = rig.events()
    assert (ev.prompt_tokens, ev.output_tokens, ev.endpoint) == (3, 3, "completions")


def test_models_health_metrics_openapi(rig: Rig) -> None:
    assert [m["id"] for m in rig.http.get("/v1/models").json()["data"]] == [MODEL]
    assert rig.http.get("/health").json()["backends"] == {"b1": True}
    rig.http.post("/v1/chat/completions", json=chat(max_tokens=2))
    text = rig.http.get("/metrics").text
    assert f'tokenomy_gateway_tokens_total{{model="{MODEL}",token_class="output"}} 2.0' in text
    assert "tokenomy_gateway_added_latency_seconds_count 1.0" in text
    assert "/v1/chat/completions" in rig.http.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    ("path", "content", "status", "code", "param"),
    [
        ("/v1/chat/completions", b"{not json", 400, "invalid_json", None),
        ("/v1/chat/completions", b"[1, 2]", 400, "invalid_json", None),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}', 400, "missing_field", "model"),
        ("/v1/chat/completions", json.dumps({"model": MODEL}).encode(), 400, "missing_field", "messages"),
        ("/v1/chat/completions", json.dumps(chat(max_tokens="5")).encode(), 400, "invalid_type", "max_tokens"),
        ("/v1/chat/completions", json.dumps(chat(stream="yes")).encode(), 400, "invalid_type", "stream"),
        ("/v1/chat/completions", json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).encode(),
         404, "model_not_found", "model"),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": 5}).encode(), 400, "invalid_type", "prompt"),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x" * 5000}).encode(), 413, "body_too_large", None),
        ("/v1/nothing", b"{}", 404, "not_found", None),
    ],
)
def test_bad_input_gets_openai_error_json(rig: Rig, path: str, content: bytes, status: int, code: str,
                                          param: str | None) -> None:
    r = rig.http.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param)
    assert err["message"] and err["type"]
    assert rig.events() == [] and not rig.guard.open


def test_upstream_refusal_passes_through_and_releases(rig: Rig) -> None:
    rig.upstream.fail_status = 400
    r = rig.http.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "bad"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "injected"
    assert rig.guard.released["bad"] == "upstream 400" and rig.events() == []


def test_a_reused_request_id_is_refused_not_served_twice(rig: Rig) -> None:
    assert rig.http.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "same"}).status_code == 200
    again = rig.http.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "same"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "duplicate_request_id"
    assert [e.request_id for e in rig.events()] == ["same"] and len(rig.upstream.usages) == 1
    long_id = rig.http.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "x" * 129})
    assert long_id.status_code == 400 and long_id.json()["error"]["param"] == "x-request-id"


def test_a_failed_ledger_commit_answers_500_and_still_charges(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alone (one request in flight: committed at once) and grouped (concurrent: one commit)."""

    def broken(events: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(rig.ledger, "_commit_inline", broken)
    r = rig.http.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "alone"})
    assert (r.status_code, r.json()["error"]["code"]) == (500, "ledger_write_failed")

    async def many() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=str(rig.http.base_url), timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=chat(),
                                                      headers={"x-request-id": f"g{i}"}) for i in range(8)))

    assert {r.status_code for r in asyncio.run(many())} == {500}
    assert set(rig.guard.settled) == {"alone", *(f"g{i}" for i in range(8))} and not rig.guard.open
    assert rig.events() == []


def test_a_plain_answer_is_settled_before_the_client_sees_it(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget read right after a response shows the spend, not the hold: the gateway settles
    before it writes the answer (a settle that takes a while, as a remote store's would, delays
    the answer rather than racing the client's next read)."""
    settle = rig.guard.settle

    async def slow_settle(admission: Any, usage: Any) -> None:
        await asyncio.sleep(0.2)
        await settle(admission, usage)

    monkeypatch.setattr(rig.guard, "settle", slow_settle)
    for rid in ("plain", "streamed"):
        r = rig.http.post("/v1/chat/completions", json=chat(max_tokens=3, stream=rid == "streamed"),
                          headers={"x-request-id": rid})
        assert r.status_code == 200
        assert rid in rig.guard.settled and not rig.guard.open  # settled when the client has the answer


def test_the_sdks_retry_count_reaches_admission_and_a_bad_one_is_a_400(rig: Rig,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    admit = rig.guard.admit

    async def spy(request: Any) -> Any:
        seen.append(request.retries)
        return await admit(request)

    monkeypatch.setattr(rig.guard, "admit", spy)
    assert rig.http.post("/v1/chat/completions", json=chat(), headers={"x-stainless-retry-count": "2"}).status_code == 200
    assert rig.http.post("/v1/chat/completions", json=chat()).status_code == 200
    assert seen == [2, 0]  # the closed loop queues a retry behind first attempts (docs/closed-loop.md)
    for bad in ("-1", "two", "100000"):
        r = rig.http.post("/v1/chat/completions", json=chat(), headers={"x-stainless-retry-count": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "x-stainless-retry-count"
    assert len(rig.events()) == 2
