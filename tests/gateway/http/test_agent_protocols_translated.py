"""The translated path: Messages and Responses clients in front of a backend that serves only chat.

One test per failure users keep reporting of other gateways' Messages adapters (LiteLLM's
``/v1/messages``, 2025–2026), each driven through the official SDK against a chat backend whose
stream is scripted chunk by chunk: a stream the SDK must not reject ("Content block not found"),
a ``tool_use`` whose ``input`` must not arrive empty after a text → tool_use transition, the first
``text_delta`` after a thinking → text transition, exactly one ``message_start`` whose usage is
not all zeros, and cache reads billed at the cached price with cache writes billed at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from helpers.gateway_core_support import MODEL, serve
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageFilter
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

USAGE = {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49,
         "prompt_tokens_details": {"cached_tokens": 32}, "completion_tokens_details": {"reasoning_tokens": 4}}


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
            "choices": choices, "usage": usage}


RUNNING = {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41}
SCRIPT = [  # thinking, then text, then a tool call whose arguments arrive in pieces
    _chunk({"role": "assistant", "content": ""}, usage=RUNNING),
    _chunk({"reasoning_content": "The user wants"}, usage=RUNNING),
    _chunk({"reasoning_content": " the file."}, usage=RUNNING),
    _chunk({"content": "Let me"}, usage=RUNNING),
    _chunk({"content": " look."}, usage=RUNNING),
    _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "grep", "arguments": ""}}]}, usage=RUNNING),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"query\": "}}]}, usage=RUNNING),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"ledger\"}"}}]}, usage=RUNNING),
    _chunk({}, finish="tool_calls", usage=RUNNING),
    _chunk(None, usage=USAGE),
]
WHOLE = {"id": "chatcmpl-2", "object": "chat.completion", "created": 0, "model": MODEL, "usage": USAGE,
         "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
             "role": "assistant", "content": "Let me look.", "reasoning_content": "The user wants the file.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "grep", "arguments": "{\"query\": \"ledger\"}"}}]}}]}
TOOLS = [{"name": "grep", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}]


def _chat_backend(bodies: list[dict[str, Any]]) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        bodies.append(body)
        if not body.get("stream"):
            return JSONResponse(WHOLE)
        raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in SCRIPT) + b"data: [DONE]\n\n"
        return StreamingResponse(iter([raw[i:i + 97] for i in range(0, len(raw), 97)]),  # reads split events
                                 media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])


@contextmanager
def chat_only_gateway(tmp_path: Path) -> Iterator[tuple[str, SqlLedger, list[dict[str, Any]]]]:
    bodies: list[dict[str, Any]] = []
    with serve(_chat_backend(bodies)) as up:
        cfg = config_from_dict({
            "backends": [{"id": "chat-only", "url": up, "protocols": ["chat", "completions"]}],
            "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
            "health": {"scrape_metrics": False},
            "prices": {MODEL: {"input_per_mtok": 1.0, "cached_input_per_mtok": 0.1, "output_per_mtok": 4.0}},
        })
        ledger = SqlLedger(cfg.ledger.url)
        try:
            with serve(build_app(cfg, guard=AllowAllGuard(), ledger=ledger)) as url:
                yield url, ledger, bodies
        finally:
            ledger.close()


def _events(url: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    with httpx.stream("POST", url + "/v1/messages", json=body, timeout=30) as r:
        assert r.status_code == 200
        name = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
    return out


def test_the_sdk_accumulates_a_translated_stream_with_thinking_text_and_a_tool_call(tmp_path: Path) -> None:
    with chat_only_gateway(tmp_path) as (url, ledger, bodies):
        client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        with client.messages.stream(model=MODEL, max_tokens=64, tools=TOOLS,
                                    messages=[{"role": "user", "content": "find it"}]) as stream:
            texts = list(stream.text_stream)  # "Content block not found" would raise here
            msg = stream.get_final_message()
        raw = _events(url, {"model": MODEL, "max_tokens": 64, "stream": True,
                            "messages": [{"role": "user", "content": "find it"}]})
        [ev, _] = ledger.query(UsageFilter())
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert msg.content[0].thinking == "The user wants the file."  # type: ignore[union-attr]
    assert "".join(texts) == "Let me look." and texts[0] == "Let me"  # the first text_delta after thinking
    assert msg.content[2].input == {"query": "ledger"}  # type: ignore[union-attr]  # not empty after text
    assert msg.stop_reason == "tool_use"
    names = [n for n, _ in raw]
    assert names.count("message_start") == 1 and names[0] == "message_start" and names[-1] == "message_stop"
    start_usage = raw[0][1]["message"]["usage"]
    assert start_usage["input_tokens"] + start_usage["cache_read_input_tokens"] == 40  # not all zeros
    assert bodies[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert bodies[0]["tools"][0]["function"]["name"] == "grep"
    assert (ev.prompt_tokens, ev.cached_tokens, ev.recomputed_tokens, ev.output_tokens) == (40, 32, 8, 9)


def test_cache_reads_and_writes_are_each_billed_at_their_price(tmp_path: Path) -> None:
    with chat_only_gateway(tmp_path) as (url, ledger, _):
        client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        msg = client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "find it"}])
        [ev] = ledger.query(UsageFilter())
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens, msg.usage.output_tokens) == (8, 32, 9)
    assert ev.cost_cached_usd == pytest.approx(32 * 0.1e-6)  # read: the cached price, not the full one
    assert ev.cost_recomputed_usd == pytest.approx(8 * 1e-6)  # computed (written) tokens: billed
    assert ev.cost_output_usd == pytest.approx(9 * 4e-6)


def test_responses_clients_through_a_chat_backend(tmp_path: Path) -> None:
    with chat_only_gateway(tmp_path) as (url, ledger, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        tools = [{"type": "function", "name": "grep", "parameters": TOOLS[0]["input_schema"]}]
        whole = client.responses.create(model=MODEL, input="find it", tools=tools)  # type: ignore[arg-type]
        with client.responses.stream(model=MODEL, input="find it", tools=tools) as stream:  # type: ignore[arg-type]
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
        events = ledger.query(UsageFilter())
    for resp in (whole, final):
        assert [o.type for o in resp.output] == ["reasoning", "message", "function_call"]
        call = resp.output[2]
        assert call.name == "grep" and json.loads(call.arguments) == {"query": "ledger"}  # type: ignore[union-attr]
        assert resp.usage is not None and resp.usage.output_tokens_details.reasoning_tokens == 4
    assert "".join(deltas) == "Let me look."
    assert [(e.endpoint, e.reasoning_tokens, e.cached_tokens) for e in events] == [("responses", 4, 32)] * 2
