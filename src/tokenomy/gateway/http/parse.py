"""Reading a request: size limit, JSON, the fields the gateway relies on (through the protocol's
adapter, :mod:`tokenomy.gateway.http.adapter`), request id, session identity.

Everything here raises :class:`GatewayError` (400/404/408/413), rendered in the client's protocol's
error shape; the fields the gateway does not interpret are passed to the backend untouched, which
judges them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from starlette.types import Receive

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.adapter import Adapter
from tokenomy.gateway.http.chat_adapter import CHAT
from tokenomy.gateway.metering.meter import estimate_tokens
from tokenomy.policy.closedloop.retry import RETRY_COUNT_HEADER

SESSION_HEADER = "x-session-id"
AGENT_SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "thread-id")
"""Session headers agents send on their own (Claude Code; Codex and other Responses clients)."""
REQUEST_ID_HEADER = "x-request-id"
_MAX_ID_CHARS = 128
# Labelled default: prompt tokens assumed per image/audio/video/file content part before the
# backend counts (a 1024x1024 image is ~1.1k tokens at GPT-4o's high detail, up to ~2.9k for
# LLaVA-1.6): enough that a budget hold covers a typical part; the backend's usage settles it.
MEDIA_PART_TOKENS_ESTIMATE = 2048
_KEY_MASK = (1 << 62) - 1


class Incoming(Protocol):
    """What the request path reads of an HTTP request (a Starlette ``Request`` is one)."""

    @property
    def headers(self) -> Mapping[str, str]: ...  # lower-case names

    @property
    def receive(self) -> Receive: ...


ModelResolver = Callable[[str], str]


@dataclass(slots=True)
class ParsedRequest:
    endpoint: str  # the protocol sent to the backend: "chat" | "completions" | "messages" | "responses"
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
    protocol: Adapter = CHAT  # the client's protocol (its answers and errors are in this one's shape)
    requested_model: str = ""  # the model name the client sent (an alias of ``model``, or ``model``)
    translator: Any = None  # turns a chat backend's answer back into ``protocol``'s (translated path)
    upstream_headers: dict[str, str] = field(default_factory=dict)  # client headers passed to the backend
    stored_input: list[Any] | None = None  # Responses with store: the whole input, kept with the answer
    tenant: tuple[str, ...] = ()  # the key's tenant path, when read at parse (stored answers, aliases)


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


def session_id(request: Incoming, body_ids: tuple[str, ...]) -> str:
    """The request's session, from the first source that names one (docs/agents.md): our
    ``x-session-id``; an agent's own session header (:data:`AGENT_SESSION_HEADERS`); then what the
    body names, in the adapter's order (a ``session_id`` inside ``metadata.user_id``,
    ``prompt_cache_key``, ``metadata.session_id``, ``user``). "" when none does."""
    sid = request.headers.get(SESSION_HEADER)
    if not sid:
        for name in AGENT_SESSION_HEADERS:
            sid = request.headers.get(name)
            if sid:
                break
    if not sid:
        sid = next((s for s in body_ids if s.strip()), "")
    sid = (sid or "").strip()
    if len(sid) > _MAX_ID_CHARS:
        raise _bad(f"session id is longer than {_MAX_ID_CHARS} characters", SESSION_HEADER)
    return sid


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def parse_request(request: Incoming, body: dict[str, Any], adapter: Adapter, resolve: ModelResolver) -> ParsedRequest:
    """The request as the chain reads it. ``resolve`` maps the requested model name to a served one
    (the alias table; 404 ``model_not_found`` for an unknown name)."""
    shape = adapter.shape(body)
    model = resolve(shape.model)
    rid = request.headers.get(REQUEST_ID_HEADER) or ""
    if len(rid) > _MAX_ID_CHARS:
        raise _bad(f"{REQUEST_ID_HEADER} is longer than {_MAX_ID_CHARS} characters", REQUEST_ID_HEADER)
    named = bool(rid)
    if not named:
        rid = "req-" + os.urandom(16).hex()
    sid = session_id(request, shape.body_session_ids)
    retries = _retry_count(request)
    key_text = f"s:{sid}" if sid else f"p:{shape.head}"
    return ParsedRequest(
        endpoint=adapter.name,
        body=body,
        model=model,
        stream=shape.stream,
        client_wants_usage=shape.client_wants_usage,
        max_tokens=shape.max_tokens,
        choices=shape.choices,
        prompt_tokens_estimate=estimate_tokens(shape.chars) + shape.media * MEDIA_PART_TOKENS_ESTIMATE,
        session_id=sid,
        request_id=rid,
        client_named_id=named,
        fingerprint=_digest(shape.tail),
        stream_key=hash(key_text) & _KEY_MASK,  # in-process only: Python's salted hash is fine
        retries=retries,
        protocol=adapter,
        requested_model=shape.model,
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

