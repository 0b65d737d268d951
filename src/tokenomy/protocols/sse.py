"""Server-sent events and error bodies of the two agent protocols.

Both protocols name every event (``event: NAME`` then ``data: JSON``); the anthropic SDK skips an
event without a name, so a name is never left out. A stream cut by the server ends with an error
event that each SDK turns into its typed exception:

* Anthropic: ``event: error`` with ``{"type": "error", "error": {"type", "message"}}``; the
  anthropic SDK raises ``anthropic.APIStatusError`` carrying that body.
* Responses: ``event: error`` with the Responses error event (``type: "error"``, ``code``,
  ``message``, ``param``, ``sequence_number``) plus an ``error`` object: the openai SDK raises
  ``openai.APIError`` for any streamed ``data`` with an ``error`` object (``_streaming.py``),
  while a bare Responses error event would pass through as an ordinary event and the accumulator
  would end with "Didn't receive a `response.completed` event".
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import orjson

JSON = dict[str, Any]

ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 402: "billing_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
    503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error",
}
"""Anthropic's error ``type`` per HTTP status (docs.anthropic.com, "Errors")."""

OPENAI_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    409: "conflict_error", 413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
}


def format_event(name: str, data: JSON) -> bytes:
    """One named event: ``event: NAME\\ndata: JSON\\n\\n``."""
    try:
        payload = orjson.dumps(data)
    except orjson.JSONEncodeError:  # what orjson refuses (an integer past 64 bits) the json module writes
        payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    return b"event: " + name.encode() + b"\ndata: " + payload + b"\n\n"


def format_events(events: Iterable[tuple[str, JSON]]) -> bytes:
    return b"".join(format_event(name, data) for name, data in events)


def anthropic_error_type(status: int) -> str:
    return ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error_body(status: int, message: str, type_: str | None = None) -> JSON:
    """Anthropic's error JSON (the body of an error answer, and the data of an ``error`` event)."""
    return {"type": "error", "error": {"type": type_ or anthropic_error_type(status), "message": message}}


def anthropic_error_event(status: int, message: str, type_: str | None = None) -> bytes:
    """The event that ends an Anthropic stream cut by the server (e.g. 529 ``overloaded_error``)."""
    return format_event("error", anthropic_error_body(status, message, type_))


def openai_error_body(status: int, message: str, type_: str | None = None, param: str | None = None,
                      code: str | int | None = None) -> JSON:
    """OpenAI's error JSON ``{"error": {"message", "type", "param", "code"}}`` (Responses and chat)."""
    kind = type_ or OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def responses_error_event(status: int, message: str, sequence_number: int, code: str | None = None,
                          param: str | None = None) -> bytes:
    """The event that ends a Responses stream cut by the server; the openai SDK raises ``APIError``."""
    body = openai_error_body(status, message, param=param, code=code)
    data = {"type": "error", "code": code or body["error"]["type"], "message": message, "param": param,
            "sequence_number": sequence_number, **body}
    return format_event("error", data)
