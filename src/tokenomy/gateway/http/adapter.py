"""A front-door protocol as an adapter: one job per step of the request path.

The gateway answers four protocols on one chain (:mod:`tokenomy.gateway.http.proxy`): OpenAI chat
completions and completions, Anthropic Messages and OpenAI Responses. Nothing in the chain branches
on the protocol; each step asks the request's :class:`Adapter`:

========== ================================================================================
parse      :meth:`Adapter.shape`: the fields the gateway relies on (model, stream, output
           bound, prompt size, the conversation's head and tail); 400 in the protocol's shape
cap        :meth:`Adapter.cap`: the output bound the admission allows, written into the body;
           :meth:`Adapter.ask_usage`: a stream ends with usage
meter      :meth:`Adapter.usage` (a whole answer) or :meth:`Adapter.reader` (a stream, event by
           event: output tokens as they pass, which events to hold until the ledger row is
           durable)
errors     :meth:`Adapter.error` (a refusal) and :meth:`Adapter.error_event` (a stream cut
           mid-way), each in the protocol's own shape and status
========== ================================================================================

The adapters: :mod:`.chat_adapter` (chat, completions), :mod:`.messages_adapter`,
:mod:`.responses_adapter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from tokenomy.gateway.errors import GatewayError

HOLD = b"(held until the request is recorded)"
"""What :meth:`StreamReader.feed` returns for an event to hold back until the request is recorded and
settled (it then goes out, in order, before the stream ends)."""


@dataclass(slots=True)
class Shape:
    """What the gateway reads of a request body (everything else passes through untouched)."""

    model: str
    stream: bool
    max_tokens: int | None  # per choice, as the client sent it
    choices: int = 1
    chars: int = 0  # prompt text, tool schemas and tool calls, in characters
    media: int = 0  # image/audio/file parts
    tail: str = ""  # the conversation's last turns, tool-call ids left out (repetition checks)
    head: str = ""  # its first message (which conversation prefix this is)
    client_wants_usage: bool = False  # chat: stream_options.include_usage as sent
    body_session_ids: tuple[str, ...] = ()  # session ids the body names, most specific first


@dataclass(slots=True)
class Usage:
    """A finished request's usage as the backend reported it; None where it did not say."""

    prompt: int | None = None  # every prompt token, cached or not
    output: int | None = None  # every output token, reasoning included
    cached: int = 0  # prompt tokens read from the cache
    reasoning: int = 0  # output tokens spent reasoning (a part of ``output``)

    @property
    def total(self) -> int:
        return (self.prompt or 0) + (self.output or 0)


class StreamReader(Protocol):
    """Reads one stream's events in order (created per request)."""

    usage: Usage | None  # the last usage seen

    def feed(self, name: str | None, obj: dict[str, Any], event: bytes) -> tuple[int, bytes | None]:
        """(output tokens this event carries, what to send the client): ``event`` itself, other
        bytes, ``None`` to drop it, or :data:`HOLD` (that very object: the relay compares identity)."""
        ...


class Adapter(Protocol):
    name: str  # "chat" | "completions" | "messages" | "responses"
    upstream_path: str  # the backend path of a native request
    terminator: bytes  # what ends a stream after the held events (chat: ``data: [DONE]``), or b""

    def shape(self, body: dict[str, Any]) -> Shape: ...

    def cap(self, body: dict[str, Any], limit: int) -> None:
        """Write the output bound (per choice) into ``body``."""
        ...

    def ask_usage(self, body: dict[str, Any]) -> None:
        """Make a streamed answer report usage (a no-op where the protocol always does)."""
        ...

    def usage(self, data: Any) -> Usage:
        """The usage of a whole (non-streamed) answer."""
        ...

    def reader(self, client_wants_usage: bool) -> StreamReader: ...

    def error(self, err: GatewayError) -> tuple[bytes, int, dict[str, str]]:
        """(body, status, headers) of a refusal in this protocol's shape."""
        ...

    def error_event(self, err: GatewayError) -> bytes:
        """A stream's closing error event in this protocol's shape."""
        ...


def bad(message: str, param: str | None = None, code: str = "invalid_value", status: int = 400) -> GatewayError:
    return GatewayError(status, message, "invalid_request_error", code, param)


def int_field(body: dict[str, Any], name: str) -> int | None:
    """A positive integer field, None when absent; 400 otherwise."""
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise bad(f"'{name}' must be an integer >= 1", name, "invalid_type")
    return v


def model_field(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' must be a non-empty string", "model", "missing_field" if model is None else "invalid_type")
    return model


def stream_field(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("'stream' must be a boolean", "stream", "invalid_type")
    return stream


def json_chars(value: Any) -> int:
    """Characters of ``value`` as JSON (tool schemas, tool calls: the backend renders them into the prompt)."""
    return len(orjson.dumps(value)) if value is not None else 0


def count(v: Any) -> int | None:
    """A token count from a usage object: a non-negative int, else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def catch_up(seen: int, total: int | None) -> int:
    """The output tokens a stream's reported running ``total`` adds to the ``seen`` so far (0 when
    absent or behind: a reader's own estimate may run ahead of the backend's count)."""
    return total - seen if total is not None and total >= seen else 0


def delta_tokens(chars: int) -> int:
    """A streamed delta's output tokens before the backend counts them: ~4 characters a token,
    at least 1 when it carries anything."""
    return max(1, chars // 4) if chars else 0


def sse(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def split_event(event: bytes) -> tuple[str | None, bytes | None]:
    """(the ``event:`` name, the ``data:`` payload) of one SSE event; (None, None) for a comment.
    Data lines after the first are joined with a newline, as the SSE spec says."""
    if event.startswith(b"data:"):  # the common case (OpenAI streams): one data line, no name
        nl = event.find(b"\n")
        if nl < 0 or event[nl + 1:].strip() == b"":
            return None, event[5:].strip()
    name: str | None = None
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            data.append(line[5:].strip())
    return name, (b"\n".join(data) if data else None)
