"""The request path: parse, admit, route, forward, meter, record, settle.

Order for every request (the Guard contract of :mod:`tokenomy.gateway.guard`)::

    parse -> guard.admit -> route (retry other backends on connection errors)
          -> forward -> meter -> ledger.record (durable) -> client sees completion -> guard.settle

(a stream settles before its final chunk; a plain response settles right after it is written,
in the same task, so the next request a client sends finds the request settled.)

A failure before any usage, or a client that leaves before its first token, ends in
``guard.release``; a stream cut by ``guard.on_tokens`` or left by its client after tokens were
delivered is recorded and settled for what was delivered. Settle/release happen exactly once.
Streams: the backend is always asked for usage (``stream_options.include_usage``); the usage
chunk is held until the ledger row is durable and passed on only if the client asked for it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tokenomy.core import Request as CoreRequest
from tokenomy.gateway.backends import Backend, BackendPool
from tokenomy.gateway.config import GatewayConfig
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.guard import Admission, AdmitRequest, Guard, SettledUsage
from tokenomy.gateway.ledger import Ledger, UsageEvent
from tokenomy.gateway.metering import (
    SessionState,
    SessionTracker,
    TokenClasses,
    classify,
    cost,
    usage_numbers,
)
from tokenomy.gateway.parse import Incoming, ParsedRequest, parse_request, read_json
from tokenomy.gateway.pd import PdRoute, PdRouter
from tokenomy.gateway.prom import GatewayMetrics
from tokenomy.gateway.streaming import stream_response
from tokenomy.gateway.upstream import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
)
from tokenomy.policy.router import Router

log = logging.getLogger(__name__)

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class JsonBytes(Response):
    """A JSON body already encoded, with headers given as ``str`` pairs (encoded here once).

    ``after`` runs once the response is written, also when writing it fails (settling a request
    off the client's critical path)."""

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
    backend: Backend
    t0: float  # perf_counter at arrival
    upstream_s: float = 0.0  # time spent waiting on the backend
    first_token_s: float | None = None  # perf_counter of the first output token
    last_token_s: float | None = None
    delivered_tokens: int = 0
    prefill_cached_tokens: int | None = None  # from a remote prefill (PdRoute): metering's cached count

    @property
    def admission(self) -> Admission:
        return self.ticket.admission


class Proxy:
    def __init__(
        self,
        config: GatewayConfig,
        pool: BackendPool,
        router: Router,
        ledger: Ledger,
        guard: Guard,
        metrics: GatewayMetrics,
        upstream: UpstreamPool,
    ) -> None:
        self.config = config
        self.upstream = upstream
        self.pool = pool
        self.router = router
        self.ledger = ledger
        self.guard = guard
        self.metrics = metrics
        self.sessions = SessionTracker()
        self.known_models = frozenset(config.models())
        self.background: set[asyncio.Task[None]] = set()
        self.pd: PdRouter | None = None  # routing.mode disagg/ampd (tokenomy.gateway.pd)

    # -- entry point -----------------------------------------------------------------------
    async def handle(self, request: Incoming, endpoint: str) -> Response:
        t0 = time.perf_counter()
        body = await read_json(request, self.config.server.max_body_bytes)
        req = parse_request(request, body, endpoint, self.known_models)
        if req.client_named_id and await self.ledger.exists(req.request_id):
            raise GatewayError(409, f"request id {req.request_id!r} was already used; send a new one",
                               "invalid_request_error", "duplicate_request_id", "x-request-id")
        auth = request.headers.get("authorization", "")
        api_key = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        max_tokens = req.max_tokens or self.config.server.default_max_tokens
        admission = await self.guard.admit(
            AdmitRequest(
                request_id=req.request_id,
                api_key=api_key,
                model=req.model,
                prompt_tokens_estimate=req.prompt_tokens_estimate,
                max_tokens=max_tokens,
                session_id=req.session_id or None,
                prompt_fingerprint=req.fingerprint,
                now_s=time.time(),
            )
        )
        ticket = Ticket(admission)
        try:
            self._prepare_body(req, admission, max_tokens)
            return await self._dispatch(req, ticket, t0)
        except BaseException as exc:
            await self.release(ticket, f"error: {type(exc).__name__}")
            raise

    async def release(self, ticket: Ticket, reason: str) -> None:
        """Return the admission's reservations unless it was already settled or released."""
        if not ticket.done:
            ticket.done = True
            await self.guard.release(ticket.admission, reason)

    def _prepare_body(self, req: ParsedRequest, admission: Admission, max_tokens: int) -> None:
        body = req.body
        cap = admission.output_token_cap
        limit = min(max_tokens, cap) if cap is not None else max_tokens
        key = "max_completion_tokens" if req.endpoint == "chat" and "max_completion_tokens" in body else "max_tokens"
        body[key] = limit
        if req.stream:
            opts = dict(body.get("stream_options") or {})
            opts["include_usage"] = True
            body["stream_options"] = opts

    # -- routing and forwarding ------------------------------------------------------------
    def _choose(self, req: ParsedRequest, tried: frozenset[str], route: PdRoute | None = None) -> Backend:
        if self.pd is not None and route is not None:
            return self.pd.choose_decode(req, route, tried)
        now = time.monotonic()
        cands = self.pool.candidates(req.model, now, tried)
        if not cands:
            raise GatewayError(
                503, f"no healthy backend serves {req.model!r}", "server_error", "no_backend", None, {"retry-after": "1"}
            )
        core = CoreRequest(
            request_id=req.request_id,
            arrival_s=now,
            prompt_tokens=req.prompt_tokens_estimate,
            max_output_tokens=req.max_tokens or 1,
            session_id=req.session_id,
            content=((req.stream_key, req.prompt_tokens_estimate),),
        )
        return self.pool.by_id[self.router.choose(core, cands, now)]

    async def _dispatch(self, req: ParsedRequest, ticket: Ticket, t0: float) -> Response:
        route = await self.pd.route(req) if self.pd is not None else None
        if route is not None and route.kv_transfer_params is not None:
            req.body["kv_transfer_params"] = route.kv_transfer_params
        payload = orjson.dumps(req.body)
        headers = {"content-type": "application/json", "x-request-id": req.request_id}
        tried: set[str] = set()
        for _attempt in range(self.config.server.retries + 1):
            backend = self._choose(req, frozenset(tried), route)
            tried.add(backend.instance_id)
            flight = Flight(req, ticket, backend, t0)
            if route is not None and route.kv_transfer_params is not None:
                flight.prefill_cached_tokens = route.prefill_cached_tokens
            if backend.config.api_key:
                headers["authorization"] = f"Bearer {backend.config.api_key}"
            backend.dispatched(req.request_id, req.prompt_tokens_estimate)
            up0 = time.perf_counter()
            try:
                resp = await self.upstream.request("POST", backend.url + _PATHS[req.endpoint], payload, headers)
            except UpstreamConnectError as exc:
                backend.finished(req.request_id, None, 0)
                self.metrics.upstream_failures.labels(backend.instance_id).inc()
                self.pool.mark_down(backend, time.monotonic(), str(exc))
                continue
            except UpstreamError as exc:
                backend.finished(req.request_id, None, 0)
                raise GatewayError(504 if isinstance(exc, UpstreamTimeout) else 502,
                                   f"backend {backend.instance_id}: {exc}", "server_error", "upstream_error") from None
            if resp.status_code != 200:
                return await self._pass_error(flight, resp)
            if req.stream:
                flight.upstream_s = time.perf_counter() - up0
                return stream_response(self, flight, resp)
            try:
                await resp.read()
            except UpstreamError as exc:
                backend.finished(req.request_id, None, 0)
                raise GatewayError(502, f"backend {backend.instance_id}: {exc}", "server_error",
                                   "upstream_error") from None
            flight.upstream_s = time.perf_counter() - up0
            return await self._complete(flight, resp)
        raise GatewayError(502, f"no backend for {req.model!r} could be reached", "server_error", "upstream_unreachable")

    async def _pass_error(self, flight: Flight, resp: UpstreamResponse) -> Response:
        """A backend's own refusal (e.g. 400 context too long) reaches the client as it was."""
        try:
            await resp.read()
        except UpstreamError:
            resp.content = b""
        finally:
            await resp.aclose()
            flight.backend.finished(flight.req.request_id, None, 0)
        status = resp.status_code if resp.status_code < 500 else 502
        self.metrics.count_request(flight.req.model, status)
        content = resp.content
        try:
            parsed = json.loads(content)
            ok = isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)
        except ValueError:
            ok = False
        if not ok:
            msg = f"backend {flight.backend.instance_id} answered {resp.status_code}"
            content = json.dumps(GatewayError(status, msg, "server_error", "upstream_error").body()).encode()
        await self.release(flight.ticket, f"upstream {resp.status_code}")
        return JsonBytes(content, status, {"x-request-id": flight.req.request_id})

    async def _complete(self, flight: Flight, resp: UpstreamResponse) -> Response:
        req = flight.req
        try:
            data = orjson.loads(resp.content)
        except ValueError:
            flight.backend.finished(req.request_id, None, 0)
            raise GatewayError(502, "backend answered with invalid JSON", "server_error", "upstream_error") from None
        usage = data.get("usage") if isinstance(data, dict) else None
        prompt, out, cached = usage_numbers(usage, req.prompt_tokens_estimate, 0)
        flight.backend.finished(req.request_id, req.stream_key, prompt + out)
        up1 = time.perf_counter()
        ev, settled = await self.record(flight, prompt, out, cached, status=200, outcome="ok", end_s=up1)
        headers = {"x-request-id": req.request_id, **flight.admission.headers}
        self.metrics.added_latency.observe(max(0.0, time.perf_counter() - flight.t0 - flight.upstream_s))
        return JsonBytes(resp.content, 200, headers, after=functools.partial(self.settle, flight, ev, settled))

    # -- metering --------------------------------------------------------------------------
    async def finish(
        self, flight: Flight, prompt: int, out: int, cached: int, status: int, outcome: str, end_s: float
    ) -> UsageEvent:
        """Meter, make the event durable, then settle. Called exactly once per admitted flight."""
        ev, settled = await self.record(flight, prompt, out, cached, status, outcome, end_s)
        await self.settle(flight, ev, settled)
        return ev

    async def record(
        self, flight: Flight, prompt: int, out: int, cached: int, status: int, outcome: str, end_s: float
    ) -> tuple[UsageEvent, SettledUsage]:
        """Meter and make the event durable; :meth:`settle` must follow (``finish`` does both).
        When the ledger write fails the request is settled here and a 500 GatewayError raised."""
        if flight.ticket.done:
            raise RuntimeError(f"request {flight.req.request_id} finished twice")
        flight.ticket.done = True
        req, adm = flight.req, flight.admission
        key = (adm.key_id, req.session_id)
        prev = None
        if req.session_id:
            if not self.sessions.knows(key):
                self.sessions.put(key, await self.ledger.session_state(*key) or _NO_TURN)
            prev = self.sessions.get(key)
            prev = None if prev is _NO_TURN else prev
        if flight.prefill_cached_tokens is not None:  # prefilled remotely: the prefill side's split
            cached = flight.prefill_cached_tokens
        classes = classify(prev, prompt, out, cached)
        if req.session_id and outcome == "ok":
            self.sessions.put(key, _state(classes))
        if self.pd is not None and outcome == "ok":
            self.pd.finished(req, prompt)
        c = cost(classes, self.config.price(req.model))
        ttft = None if flight.first_token_s is None else flight.first_token_s - flight.t0
        tpot = None
        if flight.first_token_s is not None and flight.last_token_s is not None and out > 1:
            tpot = (flight.last_token_s - flight.first_token_s) / (out - 1)
        ev = UsageEvent(
            request_id=req.request_id, ts_s=time.time(), tenant_path="/".join(adm.tenant_path), key_id=adm.key_id,
            model=req.model, backend=flight.backend.instance_id, endpoint=req.endpoint, stream=req.stream,
            status=status, outcome=outcome, session_id=req.session_id, turn=classes.turn,
            prompt_tokens=classes.prompt_tokens, input_tokens=classes.input_tokens,
            incremental_prefill_tokens=classes.incremental_prefill_tokens, history_tokens=classes.history_tokens,
            output_tokens=classes.output_tokens, cached_tokens=classes.cached_tokens,
            recomputed_tokens=classes.recomputed_tokens, cost_recomputed_usd=c.recomputed_usd,
            cost_cached_usd=c.cached_usd, cost_output_usd=c.output_usd, cost_usd=c.total_usd,
            cache_savings_usd=c.cache_savings_usd, ttft_s=ttft, tpot_s=tpot, e2e_s=end_s - flight.t0,
        )
        settled = SettledUsage(prompt, out, classes.cached_tokens, c.total_usd, status)
        try:
            # alone: no request is at a backend, so none can join this event's group commit
            await self.ledger.record(ev, alone=not any(b.in_flight for b in self.pool.backends))
        except Exception:
            await self.guard.settle(adm, settled)  # charge what the backend did, even unrecorded
            self.metrics.errors.labels("ledger_write_failed").inc()
            raise GatewayError(500, "usage could not be recorded", "server_error", "ledger_write_failed") from None
        return ev, settled

    async def settle(self, flight: Flight, ev: UsageEvent, settled: SettledUsage) -> None:
        """Replace the admission's holds by the recorded usage; count the request in the metrics."""
        await self.guard.settle(flight.admission, settled)
        self.metrics.count_request(ev.model, ev.status)
        self.metrics.observe_event(ev)

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` to completion even if the task that started it is cancelled."""
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


_NO_TURN = SessionState(-1, 0, 0)


def _state(c: TokenClasses) -> SessionState:
    return SessionState(c.turn, c.prompt_tokens, c.output_tokens)
