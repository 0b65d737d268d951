"""Anthropic Messages (``POST /v1/messages``) as an adapter (:mod:`tokenomy.gateway.http.adapter`).

Usage: Messages reports ``input_tokens`` (prompt tokens neither read from nor written to the cache),
``cache_creation_input_tokens``, ``cache_read_input_tokens`` and ``output_tokens``; the prompt is
their sum and the cache reads are its cached tokens (cache writes are computed: recomputed tokens).
A stream's usage comes in ``message_start`` (input) and ``message_delta`` (output, cumulative);
``message_stop`` is held until the request is recorded and settled.

Errors: ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's types and statuses
(overload is 529 ``overloaded_error``, as the SDKs expect).
"""

from __future__ import annotations

import json
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

_ID_KEYS = frozenset({"id", "tool_use_id", "cache_control", "signature"})  # differ per turn, not per action
_MEDIA = frozenset({"image", "document", "audio"})
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                403: "permission_error", 404: "not_found_error", 408: "timeout_error", 409: "invalid_request_error",
                413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def _block_chars(block: Any) -> tuple[int, int]:
    """(characters, media parts) of one content block (text, tool_use, tool_result, thinking, ...)."""
    if isinstance(block, str):
        return len(block), 0
    if not isinstance(block, dict):
        return 0, 0
    kind = block.get("type")
    if kind in _MEDIA:
        return 0, 1
    chars = media = 0
    for k in ("text", "thinking"):
        v = block.get(k)
        if isinstance(v, str):
            chars += len(v)
    if kind == "tool_use":
        chars += len(str(block.get("name", ""))) + json_chars(block.get("input"))
    content = block.get("content")  # tool_result: a string or blocks
    if isinstance(content, str):
        chars += len(content)
    elif isinstance(content, list):
        for b in content:
            c, m = _block_chars(b)
            chars += c
            media += m
    return chars, media


def _content_chars(content: Any, where: str) -> tuple[int, int]:
    if isinstance(content, str):
        return len(content), 0
    if not isinstance(content, list):
        raise bad(f"{where} must be a string or an array of content blocks", where, "invalid_type")
    chars = media = 0
    for b in content:
        c, m = _block_chars(b)
        chars += c
        media += m
    return chars, media


def _without_ids(content: Any) -> Any:
    """Content with per-turn ids left out: an agent repeating one tool call sends new ids each time."""
    if isinstance(content, list):
        return [{k: _without_ids(v) for k, v in b.items() if k not in _ID_KEYS} if isinstance(b, dict) else b
                for b in content]
    return content


def session_of_user_id(user_id: Any) -> str | None:
    """The session id inside ``metadata.user_id``: a JSON string with ``session_id`` (what coding
    agents send), or the older ``user_<hash>_account_<id>_session_<uuid>`` form; None otherwise."""
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            data = json.loads(user_id)
        except ValueError:
            return None
        sid = data.get("session_id") if isinstance(data, dict) else None
        return sid if isinstance(sid, str) and sid else None
    _, sep, tail = user_id.rpartition("_session_")
    return tail if sep and tail else None


def messages_usage(usage: Any) -> Usage:
    if not isinstance(usage, dict):
        return Usage()
    fresh = count(usage.get("input_tokens"))
    created = count(usage.get("cache_creation_input_tokens")) or 0
    read = count(usage.get("cache_read_input_tokens")) or 0
    prompt = None if fresh is None else fresh + created + read
    return Usage(prompt=prompt, output=count(usage.get("output_tokens")), cached=read)


def _delta_chars(delta: Any) -> int:
    if not isinstance(delta, dict):
        return 0
    for k in ("text", "thinking", "partial_json"):
        v = delta.get(k)
        if isinstance(v, str):
            return len(v)
    return 0


class MessagesReader:
    """A Messages stream: output estimated from each delta until ``message_delta`` says exactly."""

    __slots__ = ("seen", "start", "usage")

    def __init__(self) -> None:
        self.seen = 0
        self.start: dict[str, Any] = {}
        self.usage: Usage | None = None

    def feed(self, name: str | None, obj: dict[str, Any], event: bytes) -> tuple[int, bytes | None]:
        kind = obj.get("type", name)
        if kind == "content_block_delta":
            n = delta_tokens(_delta_chars(obj.get("delta")))
            self.seen += n
            return n, event
        if kind == "message_start":
            msg = obj.get("message")
            u = msg.get("usage") if isinstance(msg, dict) else None
            if isinstance(u, dict):
                self.start = dict(u)
                self.usage = messages_usage(u)
            return 0, event
        if kind == "message_delta":
            u = obj.get("usage")
            if isinstance(u, dict):
                merged = {**self.start, **{k: v for k, v in u.items() if v is not None}}
                self.usage = messages_usage(merged)
                n = catch_up(self.seen, count(u.get("output_tokens")))
                self.seen += n
                return n, event
            return 0, event
        if kind == "message_stop":
            return 0, HOLD
        return 0, event


class MessagesAdapter:
    name = "messages"
    upstream_path = "/v1/messages"
    terminator = b""

    def shape(self, body: dict[str, Any]) -> Shape:
        model = model_field(body)
        stream = stream_field(body)
        max_tokens = int_field(body, "max_tokens")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad("'messages' must be a non-empty array", "messages",
                      "missing_field" if messages is None else "invalid_type")
        chars = media = 0
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
                raise bad(f"messages.{i}: must be an object with role 'user' or 'assistant'", f"messages.{i}",
                          "invalid_type")
            c, p = _content_chars(m.get("content"), f"messages.{i}.content")
            chars += c
            media += p
        system = body.get("system")
        if system is not None:
            c, p = _content_chars(system, "system")
            chars += c
            media += p
        chars += json_chars(body.get("tools"))
        thinking = body.get("thinking")
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0
                                   or (max_tokens is not None and budget >= max_tokens)):
            raise bad("'thinking.budget_tokens' must be an integer >= 0 and below max_tokens",
                      "thinking.budget_tokens")
        tail = repr([(m.get("role"), _without_ids(m.get("content"))) for m in messages[-2:]])
        head = repr(system if system is not None else messages[0].get("content"))[:512]
        meta = body.get("metadata")
        sids: list[str] = []
        if isinstance(meta, dict):
            sid = session_of_user_id(meta.get("user_id"))
            if sid:
                sids.append(sid)
            if isinstance(meta.get("session_id"), str):
                sids.append(meta["session_id"])
        return Shape(model=model, stream=stream, max_tokens=max_tokens, chars=chars, media=media, tail=tail,
                     head=head, body_session_ids=tuple(sids))

    def cap(self, body: dict[str, Any], limit: int) -> None:
        body["max_tokens"] = limit

    def ask_usage(self, body: dict[str, Any]) -> None:
        return None  # Messages streams always carry usage

    def usage(self, data: Any) -> Usage:
        return messages_usage(data.get("usage") if isinstance(data, dict) else None)

    def reader(self, client_wants_usage: bool) -> MessagesReader:
        return MessagesReader()

    def error(self, err: GatewayError) -> tuple[bytes, int, dict[str, str]]:
        status = 529 if err.status == 503 and err.code == "overloaded" else err.status
        return orjson.dumps(anthropic_error(err, status)), status, err.headers

    def error_event(self, err: GatewayError) -> bytes:
        return sse("error", anthropic_error(err, err.status))


def anthropic_error(err: GatewayError, status: int) -> dict[str, Any]:
    """Anthropic's error body; a budget refusal (OpenAI's ``insufficient_quota``) is a ``billing_error``
    whatever its status (429: the SDKs raise their rate-limit error and honour ``retry-after``)."""
    kind = "billing_error" if err.type == "insufficient_quota" else _ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message, "code": err.code}}


MESSAGES = MessagesAdapter()
