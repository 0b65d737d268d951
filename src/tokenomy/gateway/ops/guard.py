"""The contract between the request path (proxy, ledger) and token operations (tenancy, limits,
budgets, breakers, admission).

The request path calls, in order::

    await guard.authenticate(api_key)                     # 401, before the body is read
    admission = await guard.admit(AdmitRequest(...))      # may raise GatewayError (401/403/429/503/402)
    ... dispatch to a backend; while streaming:
    if not guard.on_tokens(admission, n_new_output_tokens): cut the stream (hard cap crossed)
    ... at the end, exactly once, one of:
    await guard.settle(admission, SettledUsage(...))      # after the ledger row is durable
    await guard.release(admission, reason)                # failure before any usage, or disconnect

Reservations (budget, TPM estimate, concurrency) are taken in ``admit`` and returned or corrected
in ``settle``/``release``; both are idempotent per ``request_id`` so a retry never double-counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class AdmitRequest:
    """What the gateway knows about a request before dispatching it."""

    request_id: str
    api_key: str | None  # the raw bearer token, None when absent
    model: str
    prompt_tokens_estimate: int
    max_tokens: int  # output tokens over all choices (max_tokens x n)
    session_id: str | None = None
    prompt_fingerprint: str | None = None  # hash of the prompt's tail / tool call, for repetition checks
    now_s: float = 0.0
    retries: int = 0  # the client's retries of this request so far (x-stainless-retry-count)


@dataclass(slots=True)
class Admission:
    """A granted request: who it is charged to and what was reserved for it."""

    request_id: str
    key_id: str
    tenant_path: tuple[str, ...]  # (org, team, key) node ids, root first
    model: str
    priority: int = 0  # higher is served first
    tier: str = ""  # the closed loop's tier (ops.admission.closed_loop); routers may read it
    reserved_cost_usd: float = 0.0
    reserved_tokens: int = 0
    output_token_cap: int | None = None  # a hard cap the stream must not exceed (session/key budget)
    headers: dict[str, str] = field(default_factory=dict)  # x-ratelimit-* for the response


@dataclass(frozen=True, slots=True)
class SettledUsage:
    """Actual usage of a finished request (from the backend's ``usage``)."""

    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    cost_usd: float
    status: int = 200


class Guard(Protocol):
    async def authenticate(self, api_key: str | None) -> None:
        """Raise GatewayError 401 for a missing, unknown or revoked key. The request path calls it
        first: an unauthenticated caller learns nothing (body limits, request ids, models)."""
        ...

    async def admit(self, request: AdmitRequest) -> Admission: ...

    def on_tokens(self, admission: Admission, new_output_tokens: int) -> bool:
        """Account streamed tokens; False when the request must be cut now."""
        ...

    async def settle(self, admission: Admission, usage: SettledUsage) -> None: ...

    async def release(self, admission: Admission, reason: str) -> None: ...


class UsageScope(Protocol):
    """Who may read which usage (``GET /v1/usage``); a Guard implements it too."""

    async def usage_scope(self, api_key: str | None) -> tuple[str, ...]:
        """The tenant path (node ids, root first) whose subtree ``api_key`` may read; ``()`` is
        everything (the admin key). Raises GatewayError 401 for a missing, unknown or revoked key."""
        ...
