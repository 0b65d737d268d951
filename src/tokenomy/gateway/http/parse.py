"""Reading an OpenAI request: size limit, JSON, the fields the gateway relies on, session identity.

Everything here raises :class:`GatewayError` (400/404/413) with OpenAI's error JSON shape; the
fields the gateway does not interpret are passed to the backend untouched, which judges them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from starlette.types import Receive

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.metering.meter import estimate_tokens
from tokenomy.policy.closedloop.retry import RETRY_COUNT_HEADER

SESSION_HEADER = "x-session-id"
REQUEST_ID_HEADER = "x-request-id"
_MAX_ID_CHARS = 128
_MAX_CHOICES = 128  # OpenAI's bound on n
# Labelled default: prompt tokens assumed per image/audio/video/file content part before the
# backend counts (a 1024x1024 image is ~1.1k tokens at GPT-4o's high detail, up to ~2.9k for
# LLaVA-1.6): enough that a budget hold covers a typical part; the backend's usage settles it.
MEDIA_PART_TOKENS_ESTIMATE = 2048
_SCHEMA_FIELDS = ("tools", "functions", "response_format")  # JSON the backend renders into the prompt
_KEY_MASK = (1 << 62) - 1


class Incoming(Protocol):
    """What the request path reads of an HTTP request (a Starlette ``Request`` is one)."""

    @property
    def headers(self) -> Mapping[str, str]: ...  # lower-case names

    @property
    def receive(self) -> Receive: ...


@dataclass(slots=True)
class ParsedRequest:
    endpoint: str  # "chat" | "completions"
    body: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool  # stream_options.include_usage as the client sent it
    max_tokens: int | None  # per choice, as the client sent it
    choices: int  # sequences generated: max(n, best_of); the hold covers max_tokens for each
    prompt_tokens_estimate: int  # text, tool schemas and media parts
    session_id: str  # "" when the request names none
    request_id: str
    client_named_id: bool  # the id came from the client's x-request-id (checked for reuse)
    fingerprint: str  # hash of the prompt's tail (last messages / last 256 characters)
    stream_key: int  # which conversation prefix this is, for prefix-aware routing
    tier: str = ""  # the tenant's tier once admitted (ops.admission.closed_loop); routers may read it
    retries: int = 0  # the client's retries of this request so far (RETRY_COUNT_HEADER; 0 when absent)


def _bad(message: str, param: str | None = None, code: str = "invalid_value", status: int = 400) -> GatewayError:
    return GatewayError(status, message, "invalid_request_error", code, param)


async def read_json(request: Incoming, max_body_bytes: int, deadline_s: float = 30.0) -> dict[str, Any]:
    """The body as a JSON object: at most ``max_body_bytes`` (413), read within ``deadline_s`` (408:
    a client that trickles its body holds a connection and a task, and must not hold them forever)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise _bad(f"request body is larger than {max_body_bytes} bytes", code="body_too_large", status=413)
    try:
        async with asyncio.timeout(deadline_s):
            raw = await _read_body(request, max_body_bytes)
    except TimeoutError:
        raise _bad(f"the request body was not received within {deadline_s}s", code="request_timeout",
                   status=408) from None
    if not raw:
        raise _bad("request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object", code="invalid_json")
    return body


async def _read_body(request: Incoming, max_body_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:  # the ASGI messages themselves: Request.stream() costs an async generator a request
        message = await request.receive()
        if message["type"] != "http.request":
            raise _bad("the client went away before sending its body", code="client_disconnected", status=400)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_body_bytes:
            raise _bad(f"request body is larger than {max_body_bytes} bytes", code="body_too_large", status=413)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


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
        raise _bad("'messages' must be a non-empty array", "messages", "missing_field" if messages is None else "invalid_type")
    chars = media = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]", "invalid_type")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise _bad(f"messages[{i}].content must be a string or an array", f"messages[{i}].content", "invalid_type")
        text, parts = _content_size(content)
        chars += text
        media += parts
        if m.get("tool_calls") is not None:
            chars += len(json.dumps(m["tool_calls"]))
    return chars, media


def _choices(body: dict[str, Any]) -> int:
    """Sequences the backend generates (and bills): ``n``, or ``best_of`` when larger."""
    n = _int_field(body, "n") or 1
    best_of = _int_field(body, "best_of")
    if n > _MAX_CHOICES:
        raise _bad(f"'n' must be at most {_MAX_CHOICES}", "n")
    if best_of is not None and not n <= best_of <= _MAX_CHOICES:
        raise _bad(f"'best_of' must be between n ({n}) and {_MAX_CHOICES}", "best_of")
    return max(n, best_of or 1)


def _check_prompt(prompt: Any) -> tuple[int, str]:
    if isinstance(prompt, str):
        return len(prompt), prompt[-256:]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return sum(len(p) for p in prompt), prompt[-1][-256:]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return 4 * len(prompt), str(prompt[-64:])
    raise _bad(
        "'prompt' must be a non-empty string, array of strings or array of token ids",
        "prompt",
        "missing_field" if prompt is None else "invalid_type",
    )


def _int_field(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise _bad(f"'{name}' must be an integer >= 1", name, "invalid_type")
    return v


def _session_id(request: Incoming, body: dict[str, Any]) -> str:
    sid = request.headers.get(SESSION_HEADER)
    if not sid:
        meta = body.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("session_id"), str):
            sid = meta["session_id"]
    if not sid and isinstance(body.get("user"), str):
        sid = body["user"]
    sid = (sid or "").strip()
    if len(sid) > _MAX_ID_CHARS:
        raise _bad(f"session id is longer than {_MAX_ID_CHARS} characters", SESSION_HEADER)
    return sid


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def parse_request(request: Incoming, body: dict[str, Any], endpoint: str, known_models: frozenset[str]) -> ParsedRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' must be a non-empty string", "model", "missing_field" if model is None else "invalid_type")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream", "invalid_type")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("'stream_options' must be an object", "stream_options", "invalid_type")
    wants_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    max_tokens = _int_field(body, "max_tokens")
    if endpoint == "chat":
        mct = _int_field(body, "max_completion_tokens")
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
        if body.get(name) is not None:
            chars += len(orjson.dumps(body[name]))
    choices = _choices(body)
    if model not in known_models:
        raise GatewayError(404, f"the model {model!r} does not exist", "invalid_request_error", "model_not_found", "model")
    rid = request.headers.get(REQUEST_ID_HEADER) or ""
    if len(rid) > _MAX_ID_CHARS:
        raise _bad(f"{REQUEST_ID_HEADER} is longer than {_MAX_ID_CHARS} characters", REQUEST_ID_HEADER)
    named = bool(rid)
    if not named:
        rid = "req-" + os.urandom(16).hex()
    sid = _session_id(request, body)
    retries = _retry_count(request)
    key_text = f"s:{sid}" if sid else f"p:{head}"
    return ParsedRequest(
        endpoint=endpoint,
        body=body,
        model=model,
        stream=stream,
        client_wants_usage=wants_usage,
        max_tokens=max_tokens,
        choices=choices,
        prompt_tokens_estimate=estimate_tokens(chars) + media * MEDIA_PART_TOKENS_ESTIMATE,
        session_id=sid,
        request_id=rid,
        client_named_id=named,
        fingerprint=_digest(tail),
        stream_key=hash(key_text) & _KEY_MASK,  # in-process only: Python's salted hash is fine
        retries=retries,
    )


def _retry_count(request: Incoming) -> int:
    """The SDK's retry count: a small non-negative integer (anything else is a 400, not a guess)."""
    raw = (request.headers.get(RETRY_COUNT_HEADER) or "").strip()
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if not 0 <= n <= 1000:
        raise _bad(f"{RETRY_COUNT_HEADER} must be an integer from 0 to 1000, got {raw[:32]!r}", RETRY_COUNT_HEADER)
    return n


def _calls(m: dict[str, Any]) -> Any:
    calls = m.get("tool_calls")
    if not isinstance(calls, list):
        return None
    return [c.get("function") for c in calls if isinstance(c, dict)]  # ids differ each time; names/args do not
