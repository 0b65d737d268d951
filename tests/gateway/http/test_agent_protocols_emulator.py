"""The official SDKs' agent protocols through the gateway to real emulators, native and translated.

Two emulators serve chat, Messages and Responses as vLLM does; the gateway passes Messages and
Responses through (``native``) or, with backends that declare only chat, translates them
(``translated``). Either way a 5-turn tool loop completes through the SDK (the emulator answers a
forced tool choice with a call), every turn is one ledger row of the agent's session, and the
ledger's token classes equal what the emulators' own counters moved. A stored Responses chain
continues across both emulators.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.gateway_core_support import serve
from helpers.launch import emulators
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageFilter
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.routing.backends import parse_prometheus
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

MODEL = "llama-3.1-8b"
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_cached_total")
TOOLS = [{"name": "grep", "description": "Search the repository.",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}]


@pytest.fixture(scope="module")
def emus() -> Iterator[list[str]]:
    with emulators(["--time-scale", "0.05", "--instance-id", "e0"], ["--time-scale", "0.05", "--instance-id", "e1"]) as urls:
        yield urls


def _counters(urls: list[str]) -> dict[str, float]:
    total: dict[str, float] = {}
    for url in urls:
        for name, value in parse_prometheus(httpx.get(url + "/metrics", timeout=10).text).items():
            total[name] = total.get(name, 0.0) + value
    return total


def _gateway(emus: list[str], tmp_path: Path, translated: bool) -> Any:
    protocols = {"protocols": ["chat", "completions"]} if translated else {}
    cfg = config_from_dict({
        "backends": [{"id": f"e{i}", "url": u, **protocols} for i, u in enumerate(emus)],
        "router": {"name": "round_robin"},
        "aliases": [{"match": "claude-*", "model": MODEL}],
        "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
    })
    return cfg


@pytest.mark.parametrize("translated", [False, True], ids=["native", "translated"])
def test_messages_tool_loop_ledger_equals_the_emulators(emus: list[str], tmp_path: Path, translated: bool) -> None:
    cfg = _gateway(emus, tmp_path, translated)
    ledger = SqlLedger(cfg.ledger.url)
    try:
        with serve(build_app(cfg, guard=AllowAllGuard(), ledger=ledger)) as url:
            client = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0,
                                         default_headers={"X-Claude-Code-Session-Id": f"cc-{translated}"})
            system = [{"type": "text", "text": "You are a coding agent. " * 30, "cache_control": {"type": "ephemeral"}}]
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Find where the ledger is written."}]
            before = _counters(emus)
            for turn in range(5):
                kwargs: dict[str, Any] = {"model": "claude-sonnet-4-6", "system": system, "tools": TOOLS,
                                          "messages": messages, "max_tokens": 16,
                                          "tool_choice": {"type": "any"} if turn < 4 else {"type": "auto"}}
                if turn % 2:
                    with client.messages.stream(**kwargs) as stream:
                        "".join(stream.text_stream)
                        msg = stream.get_final_message()
                else:
                    msg = client.messages.create(**kwargs)
                messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
                if turn < 4:
                    [use] = [b for b in msg.content if b.type == "tool_use"]
                    assert msg.stop_reason == "tool_use" and use.name == "grep" and use.input.get("query")
                    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                                  "content": f"src/ledger.py:{turn}"}]})
            counted = client.messages.count_tokens(model="claude-sonnet-4-6", system=system, messages=messages)
            assert counted.input_tokens > 50
            moved = {k: v - before.get(k, 0.0) for k, v in _counters(emus).items()}
        events = ledger.query(UsageFilter(session_id=f"cc-{translated}"))
    finally:
        ledger.close()
    assert [e.turn for e in events] == [0, 1, 2, 3, 4]
    assert {(e.endpoint, e.requested_model) for e in events} == {("messages", "claude-sonnet-4-6")}
    assert sum(e.prompt_tokens for e in events) == moved["vllm:prompt_tokens_total"]
    assert sum(e.output_tokens for e in events) == moved["vllm:generation_tokens_total"]
    assert sum(e.cached_tokens for e in events) == moved["vllm:prompt_tokens_cached_total"]


@pytest.mark.parametrize("translated", [False, True], ids=["native", "translated"])
def test_responses_function_calls_and_a_stored_chain_across_both_emulators(emus: list[str], tmp_path: Path,
                                                                           translated: bool) -> None:
    cfg = _gateway(emus, tmp_path, translated)
    ledger = SqlLedger(cfg.ledger.url)
    functions = [{"type": "function", "name": "grep", "parameters": TOOLS[0]["input_schema"]}]
    try:
        with serve(build_app(cfg, guard=AllowAllGuard(), ledger=ledger)) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                   default_headers={"session-id": f"codex-{translated}"})
            before = _counters(emus)
            items: list[Any] = [{"role": "user", "content": "Find where the ledger is written."}]
            for turn in range(5):
                kw: dict[str, Any] = {"model": MODEL, "input": items, "tools": functions, "store": False,
                                      "max_output_tokens": 16, "tool_choice": "required" if turn < 4 else "auto"}
                if turn % 2:
                    with client.responses.stream(**kw) as stream:
                        for _ in stream:
                            pass
                        resp = stream.get_final_response()
                else:
                    resp = client.responses.create(**kw)
                items += [o.model_dump(exclude_none=True) for o in resp.output]
                if turn < 4:
                    [call] = [o for o in resp.output if o.type == "function_call"]
                    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "no match"})
            moved = {k: v - before.get(k, 0.0) for k, v in _counters(emus).items()}
            events = ledger.query(UsageFilter(session_id=f"codex-{translated}"))
            hdr = {"session-id": "chain"}
            first = client.responses.create(model=MODEL, input="Remember the word pelican.", max_output_tokens=4,
                                            extra_headers=hdr)
            second = client.responses.create(model=MODEL, input="Which word?", previous_response_id=first.id,
                                             max_output_tokens=4, extra_headers=hdr)
            third = client.responses.create(model=MODEL, input="Again?", previous_response_id=second.id,
                                            max_output_tokens=4, extra_headers=hdr)
        chain = ledger.query(UsageFilter(session_id="chain"))
    finally:
        ledger.close()
    assert [e.turn for e in events] == [0, 1, 2, 3, 4] and {e.endpoint for e in events} == {"responses"}
    assert sum(e.prompt_tokens for e in events) == moved["vllm:prompt_tokens_total"]
    assert sum(e.output_tokens for e in events) == moved["vllm:generation_tokens_total"]
    assert sum(e.cached_tokens for e in events) == moved["vllm:prompt_tokens_cached_total"]
    assert len({e.backend for e in chain}) == 2  # round robin: the chain crossed both emulators
    assert third.usage.input_tokens > second.usage.input_tokens > first.usage.input_tokens  # type: ignore[union-attr]
