"""The route step: where one request goes, decided once, before it is forwarded.

:class:`Routing` is the step (one per ``routing.mode``: :class:`Colocated` here,
:class:`tokenomy.gateway.routing.pd.Disagg`, :class:`tokenomy.gateway.routing.ampd_live.AmpdRouting`;
:func:`tokenomy.gateway.routing.build.build_routing` picks it). Its answer, a :class:`Route`, is all the
later steps need: the forward step asks it for a backend per attempt (:meth:`Route.pick`, another one
after a connection error), the meter step tells it that the answer is complete (:meth:`Route.done`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from tokenomy.core import Request as CoreRequest
from tokenomy.core import Role
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.parse import ParsedRequest
from tokenomy.gateway.routing.backends import Backend, BackendPool
from tokenomy.policy.router import Router


def core_request(req: ParsedRequest, now: float, history_tokens: int = 0, prompt_tokens: int | None = None
                 ) -> CoreRequest:
    """The policy-side view of a parsed request (one content segment: its conversation prefix);
    ``prompt_tokens``: a better prompt size than the parser's estimate (AMPD's calibrated one)."""
    prompt = max(1, req.prompt_tokens_estimate if prompt_tokens is None else prompt_tokens)
    return CoreRequest(
        request_id=req.request_id, arrival_s=now, prompt_tokens=prompt,
        max_output_tokens=req.max_tokens or 1, session_id=req.session_id,
        history_tokens=min(history_tokens, prompt - 1), content=((req.stream_key, prompt),),
    )



def _no_backend(what: str, model: str) -> GatewayError:
    return GatewayError(503, f"no healthy {what}backend serves {model!r}", "server_error", "no_backend", None,
                        {"retry-after": "1"})


class Route:
    """Colocated routing's answer: the router picks among every healthy backend of the model."""

    __slots__ = ("kv_transfer_params", "pool", "prefill_instance", "reason", "router")

    def __init__(self, pool: BackendPool, router: Router, reason: str = "colocated",
                 kv_transfer_params: dict[str, Any] | None = None, prefill_instance: str | None = None) -> None:
        self.pool = pool
        self.router = router
        self.reason = reason
        self.kv_transfer_params = kv_transfer_params  # carried by the decode request (P/D); None: none
        self.prefill_instance = prefill_instance  # the backend that ran the remote prefill (P/D)

    def pick(self, req: ParsedRequest, tried: frozenset[str]) -> Backend:
        """The backend for the next attempt (``tried``: those that could not be reached)."""
        now = time.monotonic()
        cands = self.pool.candidates(req.model, now, tried)
        if not cands:
            raise _no_backend("", req.model)
        core = CoreRequest(
            request_id=req.request_id,
            arrival_s=now,
            prompt_tokens=req.prompt_tokens_estimate,
            max_output_tokens=req.max_tokens or 1,
            session_id=req.session_id,
            content=((req.stream_key, req.prompt_tokens_estimate),),
        )
        return self.pool.by_id[self.router.choose(core, cands, now)]

    def done(self, req: ParsedRequest, prompt_tokens: int) -> None:
        """The client's answer is complete; ``prompt_tokens``: what the backend counted (0: unknown)."""


class DecodeRoute(Route):
    """A P/D answer: the decode backend is decided; after it failed, another decode backend (the
    router's pick). ``on_done``: told when the answer is complete (AMPD: the tool call starts)."""

    __slots__ = ("decode_instance", "on_done")

    def __init__(self, pool: BackendPool, router: Router, decode_instance: str, reason: str,
                 kv_transfer_params: dict[str, Any] | None = None, prefill_instance: str | None = None,
                 on_done: Callable[[ParsedRequest, int], None] | None = None) -> None:
        super().__init__(pool, router, reason, kv_transfer_params, prefill_instance)
        self.decode_instance = decode_instance
        self.on_done = on_done

    def pick(self, req: ParsedRequest, tried: frozenset[str]) -> Backend:
        if self.decode_instance not in tried:
            b = self.pool.by_id[self.decode_instance]
            if b.healthy or b.retry_at_s <= time.monotonic():
                return b
        cands = role_candidates(self.pool, Role.DECODE, req.model, tried)
        if not cands:
            raise _no_backend("decode ", req.model)
        now = time.monotonic()
        return self.pool.by_id[self.router.choose(core_request(req, now), cands, now)]

    def done(self, req: ParsedRequest, prompt_tokens: int) -> None:
        if self.on_done is not None:
            self.on_done(req, prompt_tokens)


def role_candidates(pool: BackendPool, role: Role, model: str, exclude: frozenset[str] = frozenset()) -> list[Backend]:
    """Healthy backends of ``role`` serving ``model`` (those past their backoff when none is)."""
    return [b for b in pool.candidates(model, time.monotonic(), exclude) if b.role is role]


def decode_candidates(pool: BackendPool, model: str) -> list[Backend]:
    """The decode backends a P/D route may choose; a 503 GatewayError when there is none."""
    decodes = role_candidates(pool, Role.DECODE, model)
    if not decodes:
        raise _no_backend("decode ", model)
    return decodes


class Routing(Protocol):
    """The route step of ``routing.mode``."""

    router: Router

    async def route(self, req: ParsedRequest) -> Route:
        """Where ``req`` goes; runs what must happen before it is forwarded (a remote prefill, a
        wait in a gate). Raises GatewayError when it cannot go anywhere."""
        ...


class Colocated:
    """``routing.mode: colocated``: every backend serves whole requests; the router picks one."""

    def __init__(self, pool: BackendPool, router: Router) -> None:
        self.router = router
        self._route = Route(pool, router)  # no state per request

    async def route(self, req: ParsedRequest) -> Route:
        return self._route
