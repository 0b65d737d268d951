"""Streams cut by the guard or left by their client: metered for what was read (``cancel``) or for the
backend's whole answer (``finish``), settled once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.gateway_core_support import MODEL, FakeUpstream, serve
from helpers.polling import wait_for
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageEvent, UsageFilter
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.ops.guard import Admission
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration


class CappedGuard(AllowAllGuard):
    """Cuts a stream once it would exceed ``cap`` output tokens."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap
        self.seen: dict[str, int] = {}
        self.refused_at: float | None = None

    def on_tokens(self, admission: Admission, new_output_tokens: int) -> bool:
        n = self.seen.get(admission.request_id, 0) + new_output_tokens
        self.seen[admission.request_id] = n
        if n > self.cap:
            self.refused_at = self.refused_at or time.monotonic()
            return False
        return True


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[[FakeUpstream, AllowAllGuard], tuple[str, SqlLedger]]]:
    stack: list[Any] = []

    def start(upstream: FakeUpstream, guard: AllowAllGuard, **server: Any) -> tuple[str, SqlLedger]:
        up = serve(upstream.app())
        up_url = up.__enter__()
        stack.append(up)
        cfg = config_from_dict({"backends": [{"id": "b1", "url": up_url}], "server": server,
                                "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"}})
        ledger = SqlLedger(cfg.ledger.url)
        gw = serve(build_app(cfg, guard=guard, ledger=ledger))
        url = gw.__enter__()
        stack.append(gw)
        stack.append(ledger)
        return url, ledger

    yield start
    for item in reversed(stack):
        if isinstance(item, SqlLedger):
            item.close()
        else:
            item.__exit__(None, None, None)


def _events(ledger: SqlLedger) -> list[UsageEvent]:
    return ledger.query(UsageFilter())


def test_a_stream_crossing_its_cap_is_cut_at_once_and_metered_for_what_was_delivered(make: Any) -> None:
    upstream = FakeUpstream(token_delay_s=0.02)
    guard = CappedGuard(cap=5)
    url, ledger = make(upstream, guard)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "loop"}], "max_tokens": 200, "stream": True}
    with httpx.Client(base_url=url, timeout=10) as http:
        r = http.post("/v1/chat/completions", json=body, headers={"x-request-id": "runaway"})
    ended = time.monotonic()
    blocks = [b[6:] for b in r.text.split("\n\n") if b.startswith("data: ")]
    assert blocks[-1] == "[DONE]"
    assert json.loads(blocks[-2])["error"]["code"] == "stream_cut"
    delivered = [json.loads(b)["choices"][0]["delta"]["content"] for b in blocks[:-2]]
    assert len(delivered) == 5
    assert guard.refused_at is not None and ended - guard.refused_at < 1.0
    [ev] = _events(ledger)
    assert (ev.outcome, ev.output_tokens) == ("cut", 5)
    assert guard.settled["runaway"].output_tokens == 5 and not guard.open
    wait_for(lambda: upstream.aborted == 1)  # the backend stopped generating


def test_a_client_leaving_mid_stream_is_metered_and_settled(make: Any) -> None:
    upstream = FakeUpstream(token_delay_s=0.05)
    guard = AllowAllGuard()
    url, ledger = make(upstream, guard)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "stream": True}
    with httpx.Client(base_url=url, timeout=10) as http, http.stream(
        "POST", "/v1/chat/completions", json=body, headers={"x-request-id": "gone"}
    ) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 3:
                break
    [ev] = wait_for(lambda: _events(ledger))
    assert (ev.outcome, ev.status) == ("disconnected", 499)
    assert 3 <= ev.output_tokens < 100
    assert guard.settled["gone"].output_tokens == ev.output_tokens and not guard.open
    wait_for(lambda: upstream.aborted == 1)


def test_a_client_leaving_before_the_first_token_is_released(make: Any) -> None:
    upstream = FakeUpstream(token_delay_s=0.3)
    guard = AllowAllGuard()
    url, ledger = make(upstream, guard)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True}
    with httpx.Client(base_url=url, timeout=10) as http, http.stream(
        "POST", "/v1/chat/completions", json=body, headers={"x-request-id": "early"}
    ) as r:
        assert r.status_code == 200  # headers come before any token; leave now
    wait_for(lambda: "early" in guard.released)
    assert guard.released["early"] == "client disconnected" and "early" not in guard.settled
    assert _events(ledger) == []


def _leave_after(url: str, rid: str, body: dict[str, Any], events: int) -> None:
    """Stream ``body`` and hang up after ``events`` data events."""
    with httpx.Client(base_url=url, timeout=10) as http, http.stream(
        "POST", "/v1/chat/completions", json=body, headers={"x-request-id": rid}
    ) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == events:
                break


def test_a_client_leaving_after_the_backend_answered_is_billed_its_prompt(make: Any) -> None:
    # The role chunk comes once the prompt is computed: the engine spent it, so the ledger bills it.
    upstream = FakeUpstream(token_delay_s=0.3, role_first=True)
    guard = AllowAllGuard()
    url, ledger = make(upstream, guard)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c d e f"}], "max_tokens": 10, "stream": True}
    _leave_after(url, "answered", body, events=1)
    [ev] = wait_for(lambda: _events(ledger))
    assert (ev.outcome, ev.output_tokens) == ("disconnected", 0)
    assert ev.prompt_tokens > 0 and guard.settled["answered"].prompt_tokens == ev.prompt_tokens
    wait_for(lambda: upstream.aborted == 1)


def test_finish_reads_a_left_stream_to_its_end_and_bills_the_backends_usage(make: Any) -> None:
    upstream = FakeUpstream(token_delay_s=0.01)
    guard = AllowAllGuard()
    url, ledger = make(upstream, guard, on_client_disconnect="finish")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 60, "stream": True}
    _leave_after(url, "left", body, events=3)
    [ev] = wait_for(lambda: _events(ledger))
    [usage] = upstream.usages
    assert (ev.outcome, ev.status) == ("disconnected", 499)
    assert (ev.prompt_tokens, ev.output_tokens) == (usage["prompt_tokens"], usage["completion_tokens"]) == (
        usage["prompt_tokens"], 60)
    assert guard.settled["left"].output_tokens == 60 and not guard.open
    assert upstream.aborted == 0  # the backend finished its answer


def test_finish_still_cuts_a_left_stream_at_its_cap(make: Any) -> None:
    upstream = FakeUpstream(token_delay_s=0.01)
    guard = CappedGuard(cap=10)
    url, ledger = make(upstream, guard, on_client_disconnect="finish")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "loop"}], "max_tokens": 200, "stream": True}
    _leave_after(url, "capped", body, events=3)
    [ev] = wait_for(lambda: _events(ledger))
    assert (ev.outcome, ev.output_tokens) == ("disconnected", 10)
    wait_for(lambda: upstream.aborted == 1)
