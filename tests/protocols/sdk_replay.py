"""Replay translated streams through the real anthropic and openai SDKs, in process.

Each SDK client is given an HTTP transport that answers every request with the bytes under test,
so the SDK's own SSE decoder, event models and stream accumulator (anthropic ``MessageStream``,
openai ``ResponseStreamState``) judge them exactly as they would judge a gateway's answer.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import httpx2
import openai

from tokenomy.protocols.sse import format_events

CHAT_ID = "chatcmpl-t1"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict[str, Any] | None = None,
          *, stop_reason: Any = None, empty: bool = False) -> dict[str, Any]:
    """A chat stream chunk (``empty``: the final usage chunk with ``choices: []``)."""
    out: dict[str, Any] = {"id": CHAT_ID, "object": "chat.completion.chunk", "created": 1700000000, "model": "tiny"}
    if empty:
        out["choices"] = []
    else:
        choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
        if stop_reason is not None:
            choice["stop_reason"] = stop_reason
        out["choices"] = [choice]
    if usage is not None:
        out["usage"] = usage
    return out


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def tool_delta(index: int, args: str, call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if call_id is not None:
        call.update(id=call_id, type="function")
        call["function"]["name"] = name
    return {"tool_calls": [call]}


def _sse(body: bytes) -> Any:
    def handler(request: Any) -> Any:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    return handler


def anthropic_client(body: bytes) -> anthropic.Anthropic:
    transport = httpx2.MockTransport(_sse(body))
    return anthropic.Anthropic(api_key="test", base_url="http://gateway.test", max_retries=0,
                               http_client=httpx2.Client(transport=transport))


def anthropic_final(events: list[tuple[str, dict[str, Any]]]) -> Any:
    """The message the anthropic SDK's ``messages.stream()`` accumulates from ``events``."""
    client = anthropic_client(format_events(events))
    with client.messages.stream(model="tiny", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
        return s.get_final_message()


def openai_client(body: bytes) -> openai.OpenAI:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    return openai.OpenAI(api_key="test", base_url="http://gateway.test/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def openai_final(events: list[tuple[str, dict[str, Any]]], tools: list[dict[str, Any]] | None = None) -> Any:
    """The response the openai SDK's ``responses.stream()`` accumulates from ``events``."""
    client = openai_client(format_events(events))
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    with client.responses.stream(model="tiny", input="hi", **kwargs) as s:
        for _ in s:
            pass
        return s.get_final_response()
