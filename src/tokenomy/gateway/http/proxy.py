"""The request path: authenticate -> parse -> admit -> route -> forward -> meter -> record -> settle.

:meth:`Proxy.handle` runs the steps in this order, each once, each in its own module::

    authenticate tokenomy.gateway.ops.guard     Guard.authenticate: 401 before the body is read
    parse    tokenomy.gateway.http.parse        body and headers -> ParsedRequest (400 on bad input),
                                                through the protocol's adapter (http.adapter);
                                                model aliases (routing.aliases); a Responses chain
                                                (http.response_chain); translation to chat for a
                                                backend without the protocol (http.translate)
    admit    tokenomy.gateway.ops.guard         Guard.admit: key, limits, budget holds, breakers
    route    tokenomy.gateway.routing.route     Routing.route: backend (P/D: remote prefill, AMPD gates)
    forward  tokenomy.gateway.routing.upstream  the request to the backend (retry others on
                                                connection errors; the client: upstream_pool,
                                                or upstream_aiohttp); streams relay through
                                                tokenomy.gateway.http.streaming
    meter    tokenomy.gateway.http.flight       Completion.meter: token classes and cost
    record   tokenomy.gateway.metering.ledger   Completion.record: the usage event, durable
    settle   tokenomy.gateway.ops.guard         Completion.settle: holds -> what was used
    (the client sees completion)

(settle comes before the client sees completion: a stream settles before its final chunk, a
plain response before it is written, so a budget read after a response shows the spend.)

A failure before any usage, or a client that leaves before its first token, ends in
``guard.release``; a stream cut by ``guard.on_tokens`` or left by its client after tokens were
delivered is recorded and settled for what was delivered. Settle/release happen exactly once.
Streams: the backend is always asked for usage; the events that tell the client the request is
complete are held until the ledger row is durable (:mod:`tokenomy.gateway.http.streaming`).
Errors are rendered in the client's protocol by its adapter (:mod:`tokenomy.gateway.http.app`).
"""

from __future__ import annotations

import functools
import json
import time

import orjson
from starlette.responses import Response

from tokenomy.gateway.config import GatewayConfig
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.adapter import Adapter
from tokenomy.gateway.http.chat_adapter import CHAT, COMPLETIONS
from tokenomy.gateway.http.flight import Completion, Flight, JsonBytes, Ticket, resolve_usage
from tokenomy.gateway.http.messages_adapter import MESSAGES
from tokenomy.gateway.http.parse import (
    MEDIA_PART_TOKENS_ESTIMATE,
    Incoming,
    ParsedRequest,
    parse_request,
    read_json,
)
from tokenomy.gateway.http.response_chain import ResponseChain
from tokenomy.gateway.http.responses_adapter import RESPONSES
from tokenomy.gateway.http.streaming import stream_response
from tokenomy.gateway.http.translate import translate
from tokenomy.gateway.metering.ledger import Ledger
from tokenomy.gateway.metering.meter import estimate_tokens
from tokenomy.gateway.metering.prom import GatewayMetrics
from tokenomy.gateway.ops.guard import AdmitRequest, Guard
from tokenomy.gateway.routing.aliases import Aliases
from tokenomy.gateway.routing.backends import BackendPool
from tokenomy.gateway.routing.route import Route, Routing
from tokenomy.gateway.routing.upstream import (
    Upstream,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResponseLike,
    UpstreamTimeout,
    UpstreamTLSError,
)

UPSTREAM: dict[str, Adapter] = {a.name: a for a in (CHAT, COMPLETIONS, MESSAGES, RESPONSES)}
"""The adapters by protocol name: what a request's ``endpoint`` (the backend's protocol) speaks."""


def api_key_of(request: Incoming) -> str | None:
    """The caller's key: ``Authorization: Bearer`` (OpenAI clients) or ``x-api-key`` (Anthropic's)."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return request.headers.get("x-api-key", "").strip() or None


_PASSED_HEADERS = ("anthropic-version", "anthropic-beta")  # to a native Messages backend, untouched


class Proxy:
    def __init__(
        self,
        config: GatewayConfig,
        pool: BackendPool,
        routing: Routing,
        ledger: Ledger,
        guard: Guard,
        metrics: GatewayMetrics,
        upstream: Upstream,
        chain: ResponseChain | None = None,
    ) -> None:
        self.config = config
        self.upstream = upstream
        self.pool = pool
        self.routing = routing
        self.ledger = ledger
        self.guard = guard
        self.metrics = metrics
        self.completion = Completion(config, pool, ledger, guard, metrics)
        self.aliases = Aliases(config.aliases, config.models())
        self.chain = chain or ResponseChain(None)
        self.completion.answers = self.chain

    # -- the chain -------------------------------------------------------------------------
    async def handle(self, request: Incoming, adapter: Adapter) -> Response:
        t0 = time.perf_counter()
        api_key = api_key_of(request)
        await self.guard.authenticate(api_key)  # first: nothing is read for an unknown caller
        req = await self.parse(request, adapter, api_key)
        ticket = await self.admit(req, api_key)
        try:
            self._cap_body(req, ticket)
            route = await self.routing.route(req)
            return await self.forward(req, ticket, route, t0)  # then meter, record, settle
        except BaseException as exc:
            await self.completion.release(ticket, f"error: {type(exc).__name__}")
            raise

    async def parse(self, request: Incoming, adapter: Adapter, api_key: str | None = None) -> ParsedRequest:
        """The request, validated, its model resolved through the alias table, a Responses chain
        expanded, translated for a backend that does not serve the protocol; a request id already
        in the ledger is refused (409)."""
        server = self.config.server
        body = await read_json(request, server.max_body_bytes, server.timeouts.body_read_s)
        tenant = await self._tenant(api_key, adapter)
        req = parse_request(request, body, adapter, lambda name: self.aliases.resolve(name, tenant))
        window = self.config.context_window_tokens(req.model)
        if req.max_tokens is not None and req.max_tokens > window:
            raise GatewayError(400, f"max_tokens {req.max_tokens} exceeds the context window of {req.model!r} "
                               f"({window} tokens)", "invalid_request_error", "max_tokens_too_large", "max_tokens")
        if adapter is RESPONSES:
            await self.chain.expand(req, tenant)
        body["model"] = req.model
        if adapter.name in ("messages", "responses"):
            if self.config.routing.mode == "colocated" and self.config.native(req.model, adapter.name):
                req.upstream_headers = {h: v for h in _PASSED_HEADERS if (v := request.headers.get(h))}
            else:  # a chat-only backend, or P/D (vLLM's hand-off is a chat-completions protocol)
                translate(req)
        if req.client_named_id and await self.ledger.exists(req.request_id):
            raise GatewayError(409, f"request id {req.request_id!r} was already used; send a new one",
                               "invalid_request_error", "duplicate_request_id", "x-request-id")
        return req

    async def _tenant(self, api_key: str | None, adapter: Adapter) -> tuple[str, ...]:
        """The key's tenant path, when something per tenant needs it (tenant-scoped aliases,
        stored Responses answers)."""
        scope = getattr(self.guard, "usage_scope", None)
        if scope is None or not (self.aliases.tenant_scoped or adapter is RESPONSES):
            return ()
        try:
            return tuple(await scope(api_key))
        except GatewayError:
            return ()

    async def admit(self, req: ParsedRequest, api_key: str | None) -> Ticket:
        """The Guard's admission (API key, rate limits, budget holds, breakers, priority); the
        output bound it holds for is per choice times choices (``n``/``best_of``)."""
        max_tokens = (req.max_tokens or self.config.server.default_max_tokens) * req.choices
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
                retries=req.retries,
            )
        )
        req.tier = admission.tier
        return Ticket(admission)

    def _cap_body(self, req: ParsedRequest, ticket: Ticket) -> None:
        """The body's output cap set to what the admission allows; streams always ask for usage."""
        max_tokens = req.max_tokens or self.config.server.default_max_tokens
        cap = ticket.admission.output_token_cap  # across all choices
        limit = min(max_tokens, cap // req.choices) if cap is not None else max_tokens
        upstream = UPSTREAM[req.endpoint]
        upstream.cap(req.body, limit)
        if req.stream:
            upstream.ask_usage(req.body)

    async def count_tokens(self, request: Incoming) -> Response:
        """``POST /v1/messages/count_tokens``: a backend's count (native), else the gateway's estimate.
        Authenticated, not metered (nothing is generated)."""
        api_key = api_key_of(request)
        await self.guard.authenticate(api_key)
        body = await read_json(request, self.config.server.max_body_bytes, self.config.server.timeouts.body_read_s)
        shape = MESSAGES.shape({**body, "max_tokens": 1})
        model = self.aliases.resolve(shape.model, await self._tenant(api_key, MESSAGES))
        backends = self.pool.candidates(model, time.monotonic())
        if backends and self.config.native(model, "messages"):
            b = backends[0]
            headers = {"content-type": "application/json"}
            if b.config.api_key:
                headers["authorization"] = f"Bearer {b.config.api_key}"
            try:
                resp = await self.upstream.request("POST", b.url + "/v1/messages/count_tokens",
                                                   orjson.dumps({**body, "model": model}), headers)
                await resp.read()
            except UpstreamError:
                resp = None
            if resp is not None and resp.status_code == 200:
                return JsonBytes(resp.content, 200, {})
        return JsonBytes(orjson.dumps({"input_tokens": estimate_tokens(shape.chars) + shape.media * MEDIA_PART_TOKENS_ESTIMATE}), 200, {})

    async def forward(self, req: ParsedRequest, ticket: Ticket, route: Route, t0: float) -> Response:
        """Send the request to the route's backend (another one after a connection error); a
        stream relays, a plain answer is metered and recorded here and settled once written."""
        if route.kv_transfer_params is not None:
            req.body["kv_transfer_params"] = route.kv_transfer_params
        payload = orjson.dumps(req.body)
        headers = {"content-type": "application/json", "x-request-id": req.request_id, **req.upstream_headers}
        path = UPSTREAM[req.endpoint].upstream_path
        tried: set[str] = set()
        last: UpstreamConnectError | None = None
        for _attempt in range(self.config.server.retries + 1):
            backend = route.pick(req, frozenset(tried))
            tried.add(backend.instance_id)
            flight = Flight(req, ticket, route, backend, t0)
            if backend.config.api_key:
                headers["authorization"] = f"Bearer {backend.config.api_key}"
            backend.dispatched(req.request_id, req.prompt_tokens_estimate)
            up0 = time.perf_counter()
            try:
                resp = await self.upstream.request("POST", backend.url + path, payload, headers)
            except UpstreamConnectError as exc:
                backend.finished(req.request_id, None, 0)
                self.metrics.upstream_failures.labels(backend.instance_id).inc()
                self.pool.mark_down(backend, time.monotonic(), str(exc), tls=isinstance(exc, UpstreamTLSError))
                last = exc
                continue
            except UpstreamError as exc:
                backend.finished(req.request_id, None, 0)
                raise GatewayError(504 if isinstance(exc, UpstreamTimeout) else 502,
                                   f"backend {backend.instance_id}: {exc}", "server_error", "upstream_error") from None
            if resp.status_code != 200:
                return await self._pass_error(flight, resp)
            if req.stream:
                flight.upstream_s = time.perf_counter() - up0
                if req.translator is not None:
                    resp = req.translator.stream(resp)
                return stream_response(self.completion, flight, resp)
            try:
                await resp.read()
            except UpstreamError as exc:
                backend.finished(req.request_id, None, 0)
                raise GatewayError(502, f"backend {backend.instance_id}: {exc}", "server_error",
                                   "upstream_error") from None
            flight.upstream_s = time.perf_counter() - up0
            return await self._complete(flight, resp)
        why = f" (last: {last})" if last is not None else ""
        code = "upstream_tls_error" if isinstance(last, UpstreamTLSError) else "upstream_unreachable"
        raise GatewayError(502, f"no backend for {req.model!r} could be reached{why}", "server_error", code)

    async def _pass_error(self, flight: Flight, resp: UpstreamResponseLike) -> Response:
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
            content = flight.req.protocol.error(GatewayError(status, msg, "server_error", "upstream_error"))[0]
        elif flight.req.translator is not None:  # a chat backend's refusal, in the client's protocol
            e = parsed["error"]
            err = GatewayError(status, str(e.get("message") or f"backend answered {resp.status_code}"),
                               str(e.get("type") or "invalid_request_error"), None, e.get("param"))
            content = flight.req.protocol.error(err)[0]
        await self.completion.release(flight.ticket, f"upstream {resp.status_code}")
        return JsonBytes(content, status, {"x-request-id": flight.req.request_id})

    async def _complete(self, flight: Flight, resp: UpstreamResponseLike) -> Response:
        req = flight.req
        try:
            data = orjson.loads(resp.content)
        except ValueError:
            flight.backend.finished(req.request_id, None, 0)
            raise GatewayError(502, "backend answered with invalid JSON", "server_error", "upstream_error") from None
        content = resp.content
        if req.translator is not None:
            data = req.translator.whole(data)
            content = orjson.dumps(data)
        usage = resolve_usage(req.protocol.usage(data), req.prompt_tokens_estimate, 0)
        flight.backend.finished(req.request_id, req.stream_key, usage.total)
        up1 = time.perf_counter()
        done = self.completion
        answer = data if req.stored_input is not None and isinstance(data, dict) else None
        ev, settled = await done.meter_and_record(flight, usage, status=200, outcome="ok", end_s=up1, answer=answer)
        # settled before the client sees the answer: a budget read after it shows the spend, not
        # the hold (docs/gateway.md, "When a request is settled"); the metrics can wait
        await self.guard.settle(flight.admission, settled)
        headers = {"x-request-id": req.request_id, **flight.admission.headers}
        self.metrics.added_latency.observe(max(0.0, time.perf_counter() - flight.t0 - flight.upstream_s))
        return JsonBytes(content, 200, headers, after=functools.partial(done.observe, ev))
