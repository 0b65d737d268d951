"""A scripted backend that serves Anthropic Messages and OpenAI Responses natively (and chat, through
:class:`helpers.gateway_core_support.FakeUpstream`), for the gateway's agent-protocol tests.

Tokens are whitespace-separated words of the prompt's text (system, messages, tool calls and
results); an answer is ``max_tokens`` words (or ``default_output``), or, when the request forces a
tool (Messages ``tool_choice`` any/tool, Responses ``required``/a named function), one call of the
first tool with ``{"query": "q<turn>"}``. Cached tokens: the longest prefix shared with an earlier
prompt + answer, in whole blocks. Every streamed byte is kept (``streamed``), so a test can compare
both sides of the gateway's relay.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from helpers.gateway_core_support import FakeUpstream
from helpers.prefix_cache import shared_prefix


def _words(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [w for v in value for w in _words(v)]
    if isinstance(value, dict):
        out: list[str] = []
        for k in ("text", "content", "output", "arguments", "thinking"):
            out += _words(value.get(k))
        if value.get("type") in ("tool_use", "function_call"):
            out += [str(value.get("name"))] + json.dumps(value.get("input", value.get("arguments", ""))).split()
        return out
    return []


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass
class AgentUpstream:
    default_output: int = 6
    block_tokens: int = 4
    token_delay_s: float = 0.0
    reasoning_tokens: int = 0  # Responses: output tokens reported as reasoning
    break_after: int | None = None  # a stream's connection drops after this many events (the engine died)
    seen: list[list[str]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    streamed: list[bytes] = field(default_factory=list)  # every stream's bytes, as sent
    counted: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "output": 0, "cached": 0})
    chat: FakeUpstream = field(default_factory=FakeUpstream)

    def _plan(self, prompt: list[str], n_out: int) -> tuple[int, list[str]]:
        best = min(shared_prefix(self.seen, prompt), len(prompt) - 1)
        cached = max(0, best - best % self.block_tokens)
        words = [f"w{i}" for i in range(n_out)]
        self.seen.append(prompt + words)
        self.counted["prompt"] += len(prompt)
        self.counted["output"] += n_out
        self.counted["cached"] += cached
        return cached, words

    async def _stream(self, events: list[bytes]) -> AsyncIterator[bytes]:
        sent = bytearray()
        try:
            for i, e in enumerate(events):
                if i == self.break_after:
                    raise ConnectionResetError("the engine died mid-stream")
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                sent += e
                yield e
        finally:
            self.streamed.append(bytes(sent))

    # -- Messages ---------------------------------------------------------------------------
    async def messages(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        prompt = _words(body.get("system")) + _words(body.get("messages"))
        choice = body.get("tool_choice") or {}
        tool = body["tools"][0]["name"] if body.get("tools") and choice.get("type") in ("any", "tool") else None
        n_out = int(body.get("max_tokens") or self.default_output)
        if tool:
            n_out = 3
        cached, words = self._plan(prompt, n_out)
        turn = len(self.seen)
        usage = {"input_tokens": len(prompt) - cached, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": cached, "output_tokens": n_out}
        block: dict[str, Any] = ({"type": "tool_use", "id": f"toolu_{turn}", "name": tool, "input": {"query": f"q{turn}"}}
                                 if tool else {"type": "text", "text": " ".join(words)})
        stop = "tool_use" if tool else "max_tokens"
        msg = {"id": f"msg_{turn}", "type": "message", "role": "assistant", "model": body["model"],
               "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return JSONResponse(msg)
        start = {**msg, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        events = [_sse("message_start", {"type": "message_start", "message": start}), _sse("ping", {"type": "ping"})]
        if tool:
            events.append(_sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                       "content_block": {**block, "input": {}}}))
            raw = json.dumps(block["input"])
            for part in (raw[:5], raw[5:]):
                events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                           "delta": {"type": "input_json_delta", "partial_json": part}}))
        else:
            events.append(_sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                       "content_block": {"type": "text", "text": ""}}))
            for i, w in enumerate(words):
                events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                           "delta": {"type": "text_delta", "text": (" " if i else "") + w}}))
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        events.append(_sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                             "usage": {"output_tokens": n_out}}))
        events.append(_sse("message_stop", {"type": "message_stop"}))
        return StreamingResponse(self._stream(events), media_type="text/event-stream")

    # -- Responses --------------------------------------------------------------------------
    async def responses(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        inp = body.get("input")
        prompt = _words(body.get("instructions")) + _words(inp if isinstance(inp, list) else [inp])
        choice = body.get("tool_choice")
        tool = body["tools"][0]["name"] if body.get("tools") and (choice == "required" or isinstance(choice, dict)) else None
        n_out = 3 if tool else int(body.get("max_output_tokens") or self.default_output)
        cached, words = self._plan(prompt, n_out)
        turn = len(self.seen)
        item: dict[str, Any] = (
            {"type": "function_call", "id": f"fc_{turn}", "call_id": f"call_{turn}", "name": tool,
             "arguments": json.dumps({"query": f"q{turn}"}), "status": "completed"} if tool else
            {"type": "message", "id": f"msg_{turn}", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": " ".join(words), "annotations": []}]})
        usage = {"input_tokens": len(prompt), "input_tokens_details": {"cached_tokens": cached},
                 "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                 "total_tokens": len(prompt) + n_out}
        resp = {"id": f"resp_{turn}_{len(self.bodies)}", "object": "response", "created_at": 0, "status": "completed",
                "model": body["model"], "output": [item], "usage": usage, "parallel_tool_calls": True,
                "tool_choice": choice or "auto", "tools": body.get("tools") or [], "store": body.get("store", True)}
        if not body.get("stream"):
            return JSONResponse(resp)
        seq = iter(range(10_000))
        events = [_sse("response.created", {"type": "response.created", "sequence_number": next(seq),
                                            "response": {**resp, "status": "in_progress", "output": [], "usage": None}})]
        events.append(_sse("response.output_item.added", {"type": "response.output_item.added", "sequence_number": next(seq),
                                                          "output_index": 0, "item": {**item, "status": "in_progress"}}))
        if tool:
            events.append(_sse("response.function_call_arguments.delta", {
                "type": "response.function_call_arguments.delta", "sequence_number": next(seq), "output_index": 0,
                "item_id": item["id"], "delta": item["arguments"]}))
        else:
            for i, w in enumerate(words):
                events.append(_sse("response.output_text.delta", {
                    "type": "response.output_text.delta", "sequence_number": next(seq), "output_index": 0,
                    "content_index": 0, "item_id": item["id"], "delta": (" " if i else "") + w, "logprobs": []}))
        events.append(_sse("response.output_item.done", {"type": "response.output_item.done", "sequence_number": next(seq),
                                                         "output_index": 0, "item": item}))
        events.append(_sse("response.completed", {"type": "response.completed", "sequence_number": next(seq),
                                                  "response": resp}))
        return StreamingResponse(self._stream(events), media_type="text/event-stream")

    async def count_tokens(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"input_tokens": len(_words(body.get("system")) + _words(body.get("messages")))})

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Mount("/", app=self.chat.app()),
        ])
