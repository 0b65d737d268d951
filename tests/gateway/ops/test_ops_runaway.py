"""A scripted runaway agent through the real app: stopped at its cap, within a second."""

from __future__ import annotations

import json
import time
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
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration


def _rig(tmp_path: Path, breaker: dict[str, Any], upstream: FakeUpstream) -> Iterator[tuple[str, str, SqlLedger]]:
    key = new_api_key()
    with serve(upstream.app()) as up_url:
        cfg = config_from_dict({
            "backends": [{"id": "b1", "url": up_url}],
            "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
            "ops": {"server_secret": SECRET, "breaker": breaker,
                    "tenants": [{"org": "o", "teams": [{"name": "t", "keys": [{"name": "agent", "key": key}]}]}]},
        })
        ledger = SqlLedger(cfg.ledger.url)
        try:
            with serve(build_app(cfg, ledger=ledger)) as url:
                yield url, key, ledger
        finally:
            ledger.close()


@pytest.fixture
def loop_rig(tmp_path: Path) -> Iterator[tuple[str, str, SqlLedger]]:
    yield from _rig(tmp_path, {"repeat_limit": 5, "cooldown_s": 60}, FakeUpstream(default_output=4))


@pytest.fixture
def stream_rig(tmp_path: Path) -> Iterator[tuple[str, str, SqlLedger]]:
    yield from _rig(tmp_path, {"session_tokens_per_min": 300, "repeat_limit": None},
                    FakeUpstream(token_delay_s=0.005))


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}


def test_agent_repeating_one_tool_call_is_refused_at_its_cap_at_once(loop_rig) -> None:
    url, key, ledger = loop_rig
    messages: list[dict[str, Any]] = [{"role": "user", "content": "find x"}]
    statuses: list[int] = []
    with httpx.Client(base_url=url, timeout=10, headers={"authorization": f"Bearer {key}",
                                                        "x-session-id": "agent-1"}) as http:
        for _ in range(20):
            messages += [{"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "no results"}]
            t0 = time.perf_counter()
            r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 4})
            statuses.append(r.status_code)
            if r.status_code != 200:
                break
    assert time.perf_counter() - t0 < 1.0
    assert statuses == [200] * 4 + [429]  # the 5th identical call in a row is refused
    err = r.json()["error"]
    assert err["code"] == "breaker_repetition" and int(r.headers["retry-after"]) == 60
    assert len(ledger.query(UsageFilter())) == 4


def test_a_stream_crossing_the_velocity_cap_is_cut_within_a_second(stream_rig) -> None:
    url, key, ledger = stream_rig
    body = {"model": MODEL, "messages": [{"role": "user", "content": "write forever"}], "max_tokens": 2000,
            "stream": True}
    arrivals: list[tuple[float, Any]] = []
    with httpx.Client(base_url=url, timeout=30) as http, http.stream(
            "POST", "/v1/chat/completions", json=body,
            headers={"authorization": f"Bearer {key}", "x-session-id": "s"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                payload = line[6:]
                arrivals.append((time.perf_counter(), payload if payload == "[DONE]" else json.loads(payload)))
    tokens = [t for t, obj in arrivals if isinstance(obj, dict) and obj.get("choices")]
    [(t_cut, cut)] = [(t, obj) for t, obj in arrivals if isinstance(obj, dict) and "error" in obj]
    assert cut["error"]["code"] == "stream_cut"
    assert len(tokens) < 300  # 300 tokens/min including the prompt: cut long before max_tokens
    assert t_cut - tokens[-1] < 1.0  # the cut follows the last delivered token at once
    [ev] = ledger.query(UsageFilter())
    assert ev.outcome == "cut" and ev.output_tokens == len(tokens)
