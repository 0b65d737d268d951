"""Anthropic Messages and OpenAI Responses through the gateway's one chain, native pass-through:
the official SDKs against a backend that serves both (``helpers.agent_upstream``), with token
operations on (keys, aliases, budgets, limits, breakers).

What a user of an agent would notice: turns complete through the SDK with tools, every streamed
event reaches the client unchanged and in order, each turn is one ledger row under the agent's own
session id with the backend's token counts, vendor model names resolve through aliases, and each
refusal arrives as the SDK's own typed exception.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.agent_upstream import AgentUpstream
from helpers.gateway_core_support import MODEL, serve
from helpers.ops_factory import SECRET
from helpers.polling import wait_for
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageFilter
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

SYSTEM = [{"type": "text", "text": "You are a coding agent. " * 20, "cache_control": {"type": "ephemeral"}}]
TOOLS = [{"name": "grep", "description": "Search the repository.",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}]
FUNCTIONS = [{"type": "function", "name": "grep", "description": "Search the repository.",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}]
ALIASES = [{"match": "claude-*-haiku-*", "model": MODEL}, {"match": "claude-*", "model": MODEL}]


@contextmanager
def rig(tmp_path: Path, upstreams: list[AgentUpstream], key_limits: dict[str, Any] | None = None,
        breaker: dict[str, Any] | None = None, protocols: list[str] | None = None,
        admission: dict[str, Any] | None = None) -> Iterator[tuple[str, str, SqlLedger]]:
    """The gateway (token operations on, one key) in front of ``upstreams``; yields (url, key, ledger)."""
    key = new_api_key()
    with contextlib_servers([u.app() for u in upstreams]) as up_urls:
        extra = {"protocols": protocols} if protocols is not None else {}
        cfg = config_from_dict({
            "backends": [{"id": f"b{i}", "url": u, **extra} for i, u in enumerate(up_urls)],
            "router": {"name": "round_robin"},
            "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
            "aliases": ALIASES,
            "ops": {"server_secret": SECRET, "breaker": breaker or {}, **({"admission": admission} if admission else {}),
                    "tenants": [{"org": "o", "teams": [{"name": "t", "keys": [
                        {"name": "agent", "key": key, **({"limits": key_limits} if key_limits else {})}]}]}]},
        })
        ledger = SqlLedger(cfg.ledger.url)
        try:
            with serve(build_app(cfg, ledger=ledger)) as url:
                yield url, key, ledger
        finally:
            ledger.close()


@contextmanager
def contextlib_servers(apps: list[Any]) -> Iterator[list[str]]:
    if not apps:
        yield []
        return
    with serve(apps[0]) as first, contextlib_servers(apps[1:]) as rest:
        yield [first, *rest]


def _claude(url: str, key: str, session: str = "cc-session-1") -> Any:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0,
                               default_headers={"X-Claude-Code-Session-Id": session,
                                                "anthropic-beta": "claude-code-20250219,some-future-flag-2027"})


def test_a_five_turn_tool_loop_over_messages_is_one_metered_session(tmp_path: Path) -> None:
    up = AgentUpstream()
    with rig(tmp_path, [up]) as (url, key, ledger):
        client = _claude(url, key)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Find where the ledger is written."}]
        for turn in range(5):
            kwargs: dict[str, Any] = {"model": "claude-sonnet-4-6", "system": SYSTEM, "tools": TOOLS,
                                      "messages": messages, "max_tokens": 32000 if turn % 2 else 8000,
                                      "tool_choice": {"type": "any"} if turn < 4 else {"type": "auto"}}
            if turn % 2:
                with client.messages.stream(**kwargs) as stream:
                    for _ in stream.text_stream:
                        pass
                    msg = stream.get_final_message()
            else:
                msg = client.messages.create(**kwargs)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
            if turn < 4:
                [use] = [b for b in msg.content if b.type == "tool_use"]
                assert msg.stop_reason == "tool_use" and use.input == {"query": f"q{turn + 1}"}
                messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                              "content": f"ledger_sql.py line {turn}"}]})
            else:
                assert msg.content[0].type == "text" and msg.stop_reason == "max_tokens"
        counted = client.messages.count_tokens(model="claude-haiku-4-5-20251001", system=SYSTEM, messages=messages)
        assert counted.input_tokens > 100
        events = ledger.query(UsageFilter(session_id="cc-session-1"))
    assert [e.turn for e in events] == [0, 1, 2, 3, 4]
    assert {(e.endpoint, e.model, e.requested_model) for e in events} == {("messages", MODEL, "claude-sonnet-4-6")}
    assert sum(e.prompt_tokens for e in events) == up.counted["prompt"]
    assert sum(e.output_tokens for e in events) == up.counted["output"]
    assert sum(e.cached_tokens for e in events) == up.counted["cached"] > 0
    assert all(e.input_tokens + e.incremental_prefill_tokens + e.history_tokens == e.prompt_tokens for e in events)
    # the body reached the backend untouched but for the served model (beta flags passed too)
    assert [b["max_tokens"] for b in up.bodies] == [8000, 32000, 8000, 32000, 8000]
    assert all(b["system"] == SYSTEM and b["model"] == MODEL for b in up.bodies)
    assert all("some-future-flag-2027" in h["anthropic-beta"] for h in up.headers)


def _raw_stream(url: str, path: str, key: str, body: dict[str, Any]) -> bytes:
    with httpx.stream("POST", url + path, json=body, timeout=30,
                      headers={"x-api-key": key, "anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200, r.read()
        return r.read()


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/messages", {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 7}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "look it up"}], "max_tokens": 7, "tools": TOOLS,
                      "tool_choice": {"type": "any"}}),
    ("/v1/responses", {"input": "hello there", "max_output_tokens": 7}),
    ("/v1/responses", {"input": "look it up", "tools": FUNCTIONS, "tool_choice": "required"}),
])
def test_every_streamed_event_reaches_the_client_unchanged_and_in_order(tmp_path: Path, path: str,
                                                                       body: dict[str, Any]) -> None:
    up = AgentUpstream()
    with rig(tmp_path, [up]) as (url, key, ledger):
        got = _raw_stream(url, path, key, {"model": MODEL, "stream": True, **body})
        [ev] = ledger.query(UsageFilter())
    [sent] = up.streamed
    assert got == sent
    assert ev.output_tokens == up.counted["output"] and ev.prompt_tokens == up.counted["prompt"]


def test_responses_function_calls_over_five_turns_and_a_stored_chain_across_two_backends(tmp_path: Path) -> None:
    ups = [AgentUpstream(reasoning_tokens=2), AgentUpstream(reasoning_tokens=2)]
    with rig(tmp_path, ups) as (url, key, ledger):
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0,
                               default_headers={"session-id": "codex-7"})
        items: list[Any] = [{"role": "user", "content": "Find where the ledger is written."}]
        for turn in range(5):
            kwargs: dict[str, Any] = {"model": MODEL, "input": items, "tools": FUNCTIONS, "store": False,
                                      "tool_choice": "required" if turn < 4 else "auto"}
            if turn % 2:
                with client.responses.stream(**kwargs) as stream:
                    for _ in stream:
                        pass
                    resp = stream.get_final_response()
            else:
                resp = client.responses.create(**kwargs)
            items += [o.model_dump(exclude_none=True) for o in resp.output]
            if turn < 4:
                [call] = [o for o in resp.output if o.type == "function_call"]
                items.append({"type": "function_call_output", "call_id": call.call_id, "output": "no match"})
        # a stored chain: each turn sends only its new input; the gateway carries the rest, whichever
        # backend (round robin: both) serves the next turn
        first = client.responses.create(model=MODEL, input="Remember the word 'pelican'.", store=True)
        second = client.responses.create(model=MODEL, input="Which word?", previous_response_id=first.id)
        third = client.responses.create(model=MODEL, input="And again?", previous_response_id=second.id, stream=False)
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model=MODEL, input="x", previous_response_id="resp_unknown")
        events = ledger.query(UsageFilter(session_id="codex-7"))
    assert [e.turn for e in events[:5]] == [0, 1, 2, 3, 4] and all(e.endpoint == "responses" for e in events)
    assert all(e.reasoning_tokens == 2 for e in events)
    chain = [b for u in ups for b in u.bodies if "pelican" in json.dumps(b)]
    assert len(chain) == 3 and {id(u) for u in ups for b in u.bodies if b in chain} == {id(u) for u in ups}
    assert all(b["store"] is False and "previous_response_id" not in b for b in chain)
    last = max((b for b in chain if isinstance(b["input"], list)), key=lambda b: len(b["input"]))
    assert [i.get("content") if isinstance(i.get("content"), str) else i["type"] for i in last["input"]] == [
        "Remember the word 'pelican'.", "message", "Which word?", "message", "And again?"]
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens  # type: ignore[union-attr]


def test_refusals_reach_each_sdk_as_its_own_typed_error(tmp_path: Path) -> None:
    with rig(tmp_path, [AgentUpstream()], key_limits={"rpm": 2}) as (url, key, _):
        claude = _claude(url, key)
        claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "one"}])
        claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "two"}])
        with pytest.raises(anthropic.RateLimitError) as err:
            claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "three"}])
        assert err.value.body["error"]["type"] == "rate_limit_error" and err.value.response.headers["retry-after"]
        with pytest.raises(anthropic.NotFoundError):
            claude.messages.create(model="gpt-4o", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        oa = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.RateLimitError):
            oa.responses.create(model=MODEL, input="four")
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="sk-wrong", max_retries=0).messages.create(
                model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}])


def test_a_budget_refusal_and_a_cut_stream_in_each_protocol(tmp_path: Path) -> None:
    with rig(tmp_path, [AgentUpstream(default_output=3000, token_delay_s=0.0)],
             breaker={"session_tokens_per_min": 400, "repeat_limit": None},
             key_limits={"budget_usd": 0.05}) as (url, key, ledger):
        claude = _claude(url, key, session="cut-me")
        with pytest.raises(anthropic.RateLimitError) as budget:  # $0.06 of output cannot be held on $0.05
            claude.messages.create(model=MODEL, max_tokens=100_000, stream=True,
                                   messages=[{"role": "user", "content": "x"}])
        assert budget.value.body["error"] == {"type": "billing_error", "code": "budget_exceeded",
                                              "message": budget.value.body["error"]["message"]}
        with pytest.raises(anthropic.APIStatusError) as cut, claude.messages.stream(
                model=MODEL, max_tokens=3000, messages=[{"role": "user", "content": "write forever"}]) as stream:
            for _ in stream.text_stream:
                pass
        assert "stream cut" in str(cut.value)
        oa = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, default_headers={"session-id": "cut-2"})
        with pytest.raises(openai.APIError) as cut2:
            for _ in oa.responses.create(model=MODEL, input="write forever", max_output_tokens=3000, stream=True):
                pass
        assert "stream cut" in str(cut2.value)
        outcomes = sorted(e.outcome for e in ledger.query(UsageFilter()))
    assert outcomes == ["cut", "cut"]


def test_a_messages_stream_its_backend_broke_bills_the_backends_prompt_and_cache_hits(tmp_path: Path) -> None:
    # message_start carries the backend's input and cache-read counts: a stream that breaks after it
    # is billed those (not the gateway's estimate of the prompt) and the output tokens delivered.
    upstream = AgentUpstream(default_output=20)
    with rig(tmp_path, [upstream]) as (url, key, ledger):
        claude = _claude(url, key, session="broken")
        long_prompt = [{"role": "user", "content": "the repository has many files " * 40}]
        claude.messages.create(model=MODEL, max_tokens=4, messages=long_prompt)  # warms the cache
        upstream.break_after = 8  # message_start, ping, content_block_start, 5 text deltas
        with pytest.raises(anthropic.APIStatusError) as broke, claude.messages.stream(
                model=MODEL, max_tokens=20, messages=long_prompt) as stream:
            for _ in stream.text_stream:
                pass
        assert "backend stream broke" in str(broke.value)
        [_, ev] = sorted(ledger.query(UsageFilter()), key=lambda e: e.ts_s)
    usage = json.loads(upstream.streamed[-1].split(b"data: ", 1)[1].split(b"\n", 1)[0])["message"]["usage"]
    assert (ev.outcome, ev.status, ev.output_tokens) == ("upstream_error", 502, 5)
    assert usage["cache_read_input_tokens"] > 0
    assert (ev.prompt_tokens, ev.cached_tokens) == (usage["input_tokens"] + usage["cache_read_input_tokens"],
                                                    usage["cache_read_input_tokens"])


def test_a_looping_tool_use_agent_trips_the_breaker(tmp_path: Path) -> None:
    with rig(tmp_path, [AgentUpstream()], breaker={"repeat_limit": 4, "cooldown_s": 60}) as (url, key, ledger):
        claude = _claude(url, key, session="looper")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "fix the build"}]
        tripped = None
        for i in range(10):
            messages += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "grep",
                                                            "input": {"query": "TODO"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                                       "content": "no results"}]}]
            try:
                claude.messages.create(model=MODEL, max_tokens=4, tools=TOOLS, messages=messages)
            except anthropic.RateLimitError as exc:
                tripped = (i, exc.body["error"]["code"])
                break
        assert tripped == (3, "breaker_repetition")
        assert len(ledger.query(UsageFilter(session_id="looper"))) == 3


def test_the_closed_loops_tiers_shed_agent_traffic_in_each_protocols_shape(tmp_path: Path) -> None:
    """A free-tier key that may not wait, with the only slot taken: Messages gets 529 ``overloaded_error``,
    Responses OpenAI's 503, both with ``retry-after`` (the SDKs would retry after it)."""
    up = AgentUpstream(token_delay_s=0.05)
    admission = {"max_in_flight": 1, "closed_loop": {"tiers": [{"name": "free", "min_priority": 0, "max_defer_s": 0.0}]}}
    with rig(tmp_path, [up], admission=admission) as (url, key, _):
        slow = threading.Thread(target=_raw_stream, args=(url, "/v1/messages", key, {
            "model": MODEL, "stream": True, "max_tokens": 40, "messages": [{"role": "user", "content": "slow"}]}))
        slow.start()
        try:
            wait_for(lambda: up.bodies, timeout_s=10, what="the slow request at the backend")
            with pytest.raises(anthropic.OverloadedError) as shed:
                _claude(url, key).messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}])
            assert shed.value.body["error"]["type"] == "overloaded_error"
            assert shed.value.response.headers["retry-after"] == "1"
            with pytest.raises(openai.InternalServerError) as shed2:
                openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0).responses.create(model=MODEL, input="x")
            assert shed2.value.status_code == 503 and shed2.value.body["code"] == "overloaded"  # type: ignore[index]
        finally:
            slow.join(30)
