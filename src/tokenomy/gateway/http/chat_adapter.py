"""OpenAI chat completions and completions as adapters (:mod:`tokenomy.gateway.http.adapter`).

Streams: the backend is always asked for usage (``stream_options.include_usage``); its usage chunk
is held until the ledger row is durable and passed on only if the client asked for it.
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
    int_field,
    json_chars,
    model_field,
    stream_field,
)

_MAX_CHOICES = 128  # OpenAI's bound on n
_SCHEMA_FIELDS = ("tools", "functions", "response_format")  # JSON the backend renders into the prompt


def _content_size(content: Any) -> tuple[int, int]:
    """(text characters, media parts) of a message's content."""
    if isinstance(content, str):
        return len(content), 0
    chars = media = 0
    if isinstance(content, list):  # content parts: text, image_url, input_audio, video_url, file
        for p in content:
            if not isinstance(p, dict):
                continue
            text = p.get("text")
            if isinstance(text, str):
                chars += len(text)
            elif p.get("type") not in (None, "text"):
                media += 1
    return chars, media


def _check_messages(messages: Any) -> tuple[int, int]:
    """(text characters, media parts) of valid ``messages``; 400 otherwise."""
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty array", "messages", "missing_field" if messages is None else "invalid_type")
    chars = media = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]", "invalid_type")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad(f"messages[{i}].content must be a string or an array", f"messages[{i}].content", "invalid_type")
        text, parts = _content_size(content)
        chars += text
        media += parts
        if m.get("tool_calls") is not None:
            chars += len(json.dumps(m["tool_calls"]))
    return chars, media


def _choices(body: dict[str, Any]) -> int:
    """Sequences the backend generates (and bills): ``n``, or ``best_of`` when larger."""
    n = int_field(body, "n") or 1
    best_of = int_field(body, "best_of")
    if n > _MAX_CHOICES:
        raise bad(f"'n' must be at most {_MAX_CHOICES}", "n")
    if best_of is not None and not n <= best_of <= _MAX_CHOICES:
        raise bad(f"'best_of' must be between n ({n}) and {_MAX_CHOICES}", "best_of")
    return max(n, best_of or 1)


def _check_prompt(prompt: Any) -> tuple[int, str]:
    if isinstance(prompt, str):
        return len(prompt), prompt[-256:]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return sum(len(p) for p in prompt), prompt[-1][-256:]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return 4 * len(prompt), str(prompt[-64:])
    raise bad(
        "'prompt' must be a non-empty string, array of strings or array of token ids",
        "prompt",
        "missing_field" if prompt is None else "invalid_type",
    )


def _calls(m: dict[str, Any]) -> Any:
    calls = m.get("tool_calls")
    if not isinstance(calls, list):
        return None
    return [c.get("function") for c in calls if isinstance(c, dict)]  # ids differ each time; names/args do not


def _body_session_ids(body: dict[str, Any]) -> tuple[str, ...]:
    meta = body.get("metadata")
    out = [meta["session_id"]] if isinstance(meta, dict) and isinstance(meta.get("session_id"), str) else []
    if isinstance(body.get("user"), str):
        out.append(body["user"])
    return tuple(out)


def _choice_tokens(c: Any) -> int:
    """Output tokens one streamed choice carries: its token ids or logprobs when the backend sent
    them (vLLM: ``return_token_ids``, ``logprobs``), else an estimate from its text (~4 characters
    a token, at least 1 when it carries anything): a backend may put several tokens in a chunk
    (speculative decoding, ``stream_interval``), so "one chunk, one token" undercounts."""
    if not isinstance(c, dict):
        return 0
    ids = c.get("token_ids")
    if isinstance(ids, list) and ids:
        return len(ids)
    lp = c.get("logprobs")
    if isinstance(lp, dict):
        seq = lp.get("content") if "content" in lp else lp.get("tokens")  # chat | completions
        if isinstance(seq, list) and seq:
            return len(seq)
    delta = c.get("delta")
    if isinstance(delta, dict):
        chars = 0
        for k in ("content", "reasoning_content", "reasoning"):
            v = delta.get(k)
            if isinstance(v, str):
                chars += len(v)
        calls = delta.get("tool_calls")
        if calls:
            chars += max(1, len(orjson.dumps(calls)) // 2)  # the JSON around the arguments is not output
        text = chars
    else:
        t = c.get("text")
        text = len(t) if isinstance(t, str) else 0
    return max(1, text // 4) if text else 0


def chat_usage(usage: Any) -> Usage:
    """An OpenAI ``usage`` object as :class:`Usage`."""
    if not isinstance(usage, dict):
        return Usage()
    details = usage.get("prompt_tokens_details")
    out_details = usage.get("completion_tokens_details")
    return Usage(
        prompt=count(usage.get("prompt_tokens")),
        output=count(usage.get("completion_tokens")),
        cached=(count(details.get("cached_tokens")) or 0) if isinstance(details, dict) else 0,
        reasoning=(count(out_details.get("reasoning_tokens")) or 0) if isinstance(out_details, dict) else 0,
    )


class ChatReader:
    """A chat/completions stream: tokens from each chunk (exact when it carries cumulative usage,
    vLLM's ``continuous_usage_stats``); the final usage chunk held, or dropped when the client did
    not ask for usage (its ``usage`` is stripped from content chunks too)."""

    __slots__ = ("client_wants_usage", "seen", "usage")

    def __init__(self, client_wants_usage: bool) -> None:
        self.client_wants_usage = client_wants_usage
        self.seen = 0
        self.usage: Usage | None = None

    def feed(self, name: str | None, obj: dict[str, Any], event: bytes) -> tuple[int, bytes | None]:
        raw_usage = obj.get("usage")
        if raw_usage:
            self.usage = chat_usage(raw_usage)
        choices = obj.get("choices")
        if not choices:
            if raw_usage:
                return 0, HOLD if self.client_wants_usage else None
            return 0, event
        if isinstance(raw_usage, dict):
            n = catch_up(self.seen, count(raw_usage.get("completion_tokens")))
        else:
            n = sum(_choice_tokens(c) for c in choices) if isinstance(choices, list) else 0
        self.seen += n
        if raw_usage and not self.client_wants_usage:
            obj["usage"] = None
            event = b"data: " + orjson.dumps(obj) + b"\n\n"
        return n, event


class ChatAdapter:
    """``POST /v1/chat/completions`` (``chat=True``) or ``/v1/completions``."""

    terminator = b"data: [DONE]\n\n"

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.name = "chat" if chat else "completions"
        self.upstream_path = "/v1/chat/completions" if chat else "/v1/completions"

    def shape(self, body: dict[str, Any]) -> Shape:
        model = model_field(body)
        stream = stream_field(body)
        opts = body.get("stream_options")
        if opts is not None and not isinstance(opts, dict):
            raise bad("'stream_options' must be an object", "stream_options", "invalid_type")
        wants_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
        max_tokens = int_field(body, "max_tokens")
        if self.chat:
            mct = int_field(body, "max_completion_tokens")
            max_tokens = mct if mct is not None else max_tokens
            chars, media = _check_messages(body.get("messages"))
            msgs = body["messages"]
            tail = repr([(m.get("role"), m.get("content"), m.get("name"), _calls(m)) for m in msgs[-2:]])
            head = repr(msgs[0].get("content"))[:512]
        else:
            chars, tail = _check_prompt(body.get("prompt"))
            media = 0
            p = body["prompt"]
            head = (p if isinstance(p, str) else str(p[0]))[:512]
        for name in _SCHEMA_FIELDS:
            chars += json_chars(body.get(name))
        return Shape(model=model, stream=stream, max_tokens=max_tokens, choices=_choices(body), chars=chars,
                     media=media, tail=tail, head=head, client_wants_usage=wants_usage,
                     body_session_ids=_body_session_ids(body))

    def cap(self, body: dict[str, Any], limit: int) -> None:
        key = "max_completion_tokens" if self.chat and "max_completion_tokens" in body else "max_tokens"
        body[key] = limit

    def ask_usage(self, body: dict[str, Any]) -> None:
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        body["stream_options"] = opts

    def usage(self, data: Any) -> Usage:
        return chat_usage(data.get("usage") if isinstance(data, dict) else None)

    def reader(self, client_wants_usage: bool) -> ChatReader:
        return ChatReader(client_wants_usage)

    def error(self, err: GatewayError) -> tuple[bytes, int, dict[str, str]]:
        return orjson.dumps(err.body()), err.status, err.headers

    def error_event(self, err: GatewayError) -> bytes:
        return b"data: " + orjson.dumps(err.body()) + b"\n\n"


CHAT = ChatAdapter(chat=True)
COMPLETIONS = ChatAdapter(chat=False)
