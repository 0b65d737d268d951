"""The back half of the request path: meter -> record -> settle (or release), once per request.

A :class:`Flight` is one admitted request on its way through a backend. :class:`Completion`
ends it: :meth:`Completion.meter` turns the backend's usage into the request's token classes and
cost (:mod:`tokenomy.gateway.metering.meter`), :meth:`Completion.record` makes the usage event
durable in the ledger, :meth:`Completion.settle` replaces the admission's holds by what was used
(the Guard, :mod:`tokenomy.gateway.ops.guard`). A request that used nothing is released instead.
Settle/release happen exactly once (:class:`Ticket`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tokenomy.gateway.config import GatewayConfig
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.adapter import Usage
from tokenomy.gateway.http.parse import ParsedRequest
from tokenomy.gateway.metering.ledger import Ledger, UsageEvent
from tokenomy.gateway.metering.meter import (
    SessionState,
    SessionTracker,
    TokenClasses,
    classify,
    cost,
    prefill_cached_tokens,
)
from tokenomy.gateway.metering.prom import GatewayMetrics
from tokenomy.gateway.ops.guard import Admission, Guard, SettledUsage
from tokenomy.gateway.routing.backends import Backend, BackendPool
from tokenomy.gateway.routing.route import Route


class JsonBytes(Response):
    """A JSON body already encoded, with headers given as ``str`` pairs (encoded here once).

    ``after`` runs once the response is written, also when writing it fails (work the client need
    not wait for: the request's metrics)."""

    def __init__(self, body: bytes, status: int, headers: dict[str, str],
                 after: Callable[[], Awaitable[None]] | None = None) -> None:
        self.status_code = status
        self.background = None
        self.body = body
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw += ((b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()))
        self.raw_headers = raw
        self.after = after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.body})
        finally:
            if self.after is not None:
                await self.after()


@dataclass(slots=True)
class Ticket:
    """An admission and whether it has been settled or released (exactly once)."""

    admission: Admission
    done: bool = False


@dataclass(slots=True)
class Flight:
    """One admitted request on its way through a backend."""

    req: ParsedRequest
    ticket: Ticket
    route: Route
    backend: Backend
    t0: float  # perf_counter at arrival
    upstream_s: float = 0.0  # time spent waiting on the backend
    first_token_s: float | None = None  # perf_counter of the first output token
    last_token_s: float | None = None
    delivered_tokens: int = 0

    @property
    def admission(self) -> Admission:
        return self.ticket.admission


class Completion:
    """Meter, record, settle (or release) admitted requests."""

    def __init__(self, config: GatewayConfig, pool: BackendPool, ledger: Ledger, guard: Guard,
                 metrics: GatewayMetrics) -> None:
        self.config = config
        self.pool = pool
        self.ledger = ledger
        self.guard = guard
        self.metrics = metrics
        self.sessions = SessionTracker()
        self.background: set[asyncio.Task[None]] = set()
        self.answers: AnswerStore | None = None  # stored Responses answers (previous_response_id)

    async def release(self, ticket: Ticket, reason: str) -> None:
        """Return the admission's reservations unless it was already settled or released."""
        if not ticket.done:
            ticket.done = True
            await self.guard.release(ticket.admission, reason)

    async def finish(self, flight: Flight, usage: Usage, status: int, outcome: str, end_s: float,
                     answer: dict[str, Any] | None = None) -> UsageEvent:
        """Meter, make the event durable, then settle. Called exactly once per admitted flight."""
        ev, settled = await self.meter_and_record(flight, usage, status, outcome, end_s, answer)
        await self.settle(flight, ev, settled)
        return ev

    async def meter_and_record(self, flight: Flight, usage: Usage, status: int, outcome: str, end_s: float,
                               answer: dict[str, Any] | None = None) -> tuple[UsageEvent, SettledUsage]:
        """Meter and make the event durable (and, for a stored Responses answer, the answer:
        ``answer``); :meth:`settle` must follow (``finish`` does both). When the ledger write fails
        the request is settled here and a 500 GatewayError raised."""
        if flight.ticket.done:
            raise RuntimeError(f"request {flight.req.request_id} finished twice")
        flight.ticket.done = True
        ev, settled = await self.meter(flight, usage, status, outcome, end_s)
        await self.record(flight, ev, settled)
        if answer is not None and outcome == "ok" and self.answers is not None:
            await self.answers.save(flight.req, answer)
        return ev, settled

    async def meter(
        self, flight: Flight, usage: Usage, status: int, outcome: str, end_s: float
    ) -> tuple[UsageEvent, SettledUsage]:
        """The usage event (token classes against the session's previous turn, cost, timings)."""
        req, adm = flight.req, flight.admission
        prompt, out, cached = usage.prompt or 0, usage.output or 0, usage.cached
        key = (adm.key_id, req.session_id)
        prev = None
        if req.session_id:
            if not self.sessions.knows(key):
                self.sessions.put(key, await self.ledger.session_state(*key) or _NO_TURN)
            prev = self.sessions.get(key)
            prev = None if prev is _NO_TURN else prev
        remote_cached = prefill_cached_tokens(flight.route.kv_transfer_params)
        if remote_cached is not None:  # prefilled remotely: the prefill side's cached/recomputed split
            cached = remote_cached
        classes = classify(prev, prompt, out, cached, usage.reasoning)
        if req.session_id and outcome == "ok":
            self.sessions.put(key, _state(classes))
        if outcome == "ok":
            flight.route.done(req, prompt)
        c = cost(classes, self.config.price(req.model))
        ttft = None if flight.first_token_s is None else flight.first_token_s - flight.t0
        tpot = None
        if flight.first_token_s is not None and flight.last_token_s is not None and out > 1:
            tpot = (flight.last_token_s - flight.first_token_s) / (out - 1)
        ev = UsageEvent(
            request_id=req.request_id, ts_s=time.time(), tenant_path="/".join(adm.tenant_path), key_id=adm.key_id,
            model=req.model, backend=flight.backend.instance_id, endpoint=req.protocol.name, stream=req.stream,
            status=status, outcome=outcome, session_id=req.session_id, turn=classes.turn,
            prompt_tokens=classes.prompt_tokens, input_tokens=classes.input_tokens,
            incremental_prefill_tokens=classes.incremental_prefill_tokens, history_tokens=classes.history_tokens,
            output_tokens=classes.output_tokens, cached_tokens=classes.cached_tokens,
            recomputed_tokens=classes.recomputed_tokens, cost_recomputed_usd=c.recomputed_usd,
            cost_cached_usd=c.cached_usd, cost_output_usd=c.output_usd, cost_usd=c.total_usd,
            cache_savings_usd=c.cache_savings_usd, ttft_s=ttft, tpot_s=tpot, e2e_s=end_s - flight.t0,
            reasoning_tokens=classes.reasoning_tokens,
            requested_model=req.requested_model if req.requested_model != req.model else "",
        )
        return ev, SettledUsage(prompt, out, classes.cached_tokens, c.total_usd, status)

    async def record(self, flight: Flight, ev: UsageEvent, settled: SettledUsage) -> None:
        """Make ``ev`` durable in the ledger (before the client sees completion)."""
        try:
            # alone: no request is at a backend, so none can join this event's group commit
            await self.ledger.record(ev, alone=not any(b.own_in_flight for b in self.pool.backends))
        except Exception:
            await self.guard.settle(flight.admission, settled)  # charge what the backend did, even unrecorded
            self.metrics.errors.labels("ledger_write_failed").inc()
            raise GatewayError(500, "usage could not be recorded", "server_error", "ledger_write_failed") from None

    async def settle(self, flight: Flight, ev: UsageEvent, settled: SettledUsage) -> None:
        """Replace the admission's holds by the recorded usage; count the request in the metrics."""
        await self.guard.settle(flight.admission, settled)
        await self.observe(ev)

    async def observe(self, ev: UsageEvent) -> None:
        """Count a finished request in the gateway's metrics."""
        self.metrics.count_request(ev.model, ev.status)
        self.metrics.observe_event(ev)

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` to completion even if the task that started it is cancelled."""
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


class AnswerStore(Protocol):
    async def save(self, req: ParsedRequest, answer: dict[str, Any]) -> None:
        """Keep what a later ``previous_response_id`` needs of a finished answer."""
        ...


def resolve_usage(usage: Usage | None, prompt_estimate: int, delivered: int) -> Usage:
    """The backend's usage with what it left out filled in: the prompt estimate, the output
    tokens delivered."""
    u = usage or Usage()
    return Usage(prompt=u.prompt if u.prompt is not None else prompt_estimate,
                 output=u.output if u.output is not None else delivered, cached=u.cached, reasoning=u.reasoning)


_NO_TURN = SessionState(-1, 0, 0)


def _state(c: TokenClasses) -> SessionState:
    return SessionState(c.turn, c.prompt_tokens, c.output_tokens)
