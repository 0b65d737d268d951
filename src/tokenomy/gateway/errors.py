"""Errors the gateway answers with: OpenAI's error JSON, an HTTP status and optional headers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class GatewayError(Exception):
    """A refusal or failure a client sees as ``{"error": {...}}`` with ``status``.

    ``type`` follows OpenAI (``invalid_request_error``, ``authentication_error``,
    ``permission_error``, ``rate_limit_error``, ``insufficient_quota``, ``server_error``);
    ``code`` is our machine-readable reason (``rate_limit_rpm``, ``budget_exceeded``,
    ``breaker_open``, ``overloaded``, ...). ``headers`` carries e.g. ``retry-after`` and
    ``x-ratelimit-*``.
    """

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
