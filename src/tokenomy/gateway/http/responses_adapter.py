"""OpenAI Responses (``POST /v1/responses``) as an adapter (:mod:`tokenomy.gateway.http.adapter`).

Usage: ``input_tokens`` (every prompt token) with ``input_tokens_details.cached_tokens``, and
``output_tokens`` with ``output_tokens_details.reasoning_tokens``. A stream's usage comes in its
terminal event (``response.completed``, ``.incomplete`` or ``.failed``), which is held until the
request is recorded and settled. Errors are OpenAI's error object; a stream cut mid-way ends with an
``error`` event that carries both the Responses fields (``code``, ``message``, ``param``) and an
``error`` object, which the openai SDK raises as ``APIError``.

``previous_response_id`` and ``store`` are the gateway's (:mod:`tokenomy.gateway.http.response_chain`).
"""

from __future__ import annotations

from typing import Any

import orjson

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.adapter import (
    HOLD,
    Shape,
    Usage,
    bad,
    catch_up,
    count,
    delta_tokens,
    int_field,
    json_chars,
    model_field,
    sse,
    stream_field,
)

_ID_KEYS = frozenset({"id", "call_id", "encrypted_content"})  # differ per turn, not per action
_MEDIA = frozenset({"input_image", "input_file", "input_audio"})
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_TEXT_DELTAS = frozenset({"response.output_text.delta", "response.reasoning_text.delta",
                          "response.reasoning_summary_text.delta", "response.function_call_arguments.delta",
                          "response.refusal.delta"})


def _item_chars(item: Any) -> tuple[int, int]:
    if isinstance(item, str):
        return len(item), 0
    if not isinstance(item, dict):
        return 0, 0
    if item.get("type") in _MEDIA:
        return 0, 1
    chars = media = 0
    for k in ("text", "arguments", "name"):
        v = item.get(k)
        if isinstance(v, str):
            chars += len(v)
    for k in ("content", "output", "summary"):
        v = item.get(k)
        if isinstance(v, str):
            chars += len(v)
        elif isinstance(v, list):
            for part in v:
                c, m = _item_chars(part)
                chars += c
                media += m
    return chars, media


def _without_ids(item: Any) -> Any:
    return {k: v for k, v in item.items() if k not in _ID_KEYS} if isinstance(item, dict) else item


def responses_usage(usage: Any) -> Usage:
    if not isinstance(usage, dict):
        return Usage()
    inp = usage.get("input_tokens_details")
    out = usage.get("output_tokens_details")
    return Usage(
        prompt=count(usage.get("input_tokens")),
        output=count(usage.get("output_tokens")),
        cached=(count(inp.get("cached_tokens")) or 0) if isinstance(inp, dict) else 0,
        reasoning=(count(out.get("reasoning_tokens")) or 0) if isinstance(out, dict) else 0,
    )


def input_items(body: dict[str, Any]) -> list[Any]:
    """``input`` as a list of items (a string is one user message)."""
    inp = body.get("input")
    if isinstance(inp, str):
        return [{"type": "message", "role": "user", "content": inp}]
    return list(inp) if isinstance(inp, list) else []


class ResponsesReader:
    """A Responses stream: output estimated from each delta until the terminal event's usage."""

    __slots__ = ("final", "seen", "usage")

    def __init__(self) -> None:
        self.seen = 0
        self.usage: Usage | None = None
        self.final: dict[str, Any] | None = None  # the terminal event's response object

    def feed(self, name: str | None, obj: dict[str, Any], event: bytes) -> tuple[int, bytes | None]:
        kind = obj.get("type", name)
        if kind in _TEXT_DELTAS:
            d = obj.get("delta")
            n = delta_tokens(len(d)) if isinstance(d, str) else 0
            self.seen += n
            return n, event
        if kind in _TERMINAL:
            resp = obj.get("response")
            if isinstance(resp, dict):
                self.final = resp
                self.usage = responses_usage(resp.get("usage"))
                n = catch_up(self.seen, self.usage.output)
                self.seen += n
                return n, HOLD
            return 0, HOLD
        return 0, event


class ResponsesAdapter:
    name = "responses"
    upstream_path = "/v1/responses"
    terminator = b""

    def shape(self, body: dict[str, Any]) -> Shape:
        model = model_field(body)
        stream = stream_field(body)
        max_tokens = int_field(body, "max_output_tokens")
        inp = body.get("input")
        prev = body.get("previous_response_id")
        if prev is not None and (not isinstance(prev, str) or not prev):
            raise bad("'previous_response_id' must be a non-empty string", "previous_response_id", "invalid_type")
        if not isinstance(inp, str | list) or (not inp and prev is None):
            raise bad("'input' must be a non-empty string or array of items", "input",
                      "missing_field" if inp is None else "invalid_type")
        items = input_items(body)
        chars = media = 0
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise bad(f"input[{i}] must be an object", f"input[{i}]", "invalid_type")
            c, m = _item_chars(item)
            chars += c
            media += m
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise bad("'instructions' must be a string", "instructions", "invalid_type")
        chars += len(instructions or "") + json_chars(body.get("tools"))
        tail = repr([_without_ids(it) for it in items[-2:]])
        head = (instructions if instructions else repr(items[0] if items else prev))[:512]
        sids = [s for s in (body.get("prompt_cache_key"),) if isinstance(s, str) and s]
        meta = body.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("session_id"), str):
            sids.append(meta["session_id"])
        if isinstance(body.get("user"), str):
            sids.append(body["user"])
        return Shape(model=model, stream=stream, max_tokens=max_tokens, chars=chars, media=media, tail=tail,
                     head=head, body_session_ids=tuple(sids))

    def cap(self, body: dict[str, Any], limit: int) -> None:
        body["max_output_tokens"] = limit

    def ask_usage(self, body: dict[str, Any]) -> None:
        return None  # the terminal event always carries usage

    def usage(self, data: Any) -> Usage:
        return responses_usage(data.get("usage") if isinstance(data, dict) else None)

    def reader(self, client_wants_usage: bool) -> ResponsesReader:
        return ResponsesReader()

    def error(self, err: GatewayError) -> tuple[bytes, int, dict[str, str]]:
        return orjson.dumps(err.body()), err.status, err.headers

    def error_event(self, err: GatewayError) -> bytes:
        e = err.body()["error"]
        return sse("error", {"type": "error", "code": err.code, "message": err.message, "param": err.param,
                             "sequence_number": 0, "error": e})


RESPONSES = ResponsesAdapter()
