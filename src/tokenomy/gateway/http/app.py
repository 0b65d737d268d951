"""The gateway's ASGI app: routes, error handling, startup and shutdown.

:func:`build_app` wires one :class:`Proxy` from a config. The Guard is token operations'
(:func:`tokenomy.gateway.ops.build.build_guard`); tests pass their own guard and ledger
(:class:`tokenomy.gateway.ops.allow_all.AllowAllGuard` admits everything).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, Router
from starlette.types import Receive, Scope, Send

from tokenomy.gateway.config import GatewayConfig
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.adapter import Adapter
from tokenomy.gateway.http.chat_adapter import CHAT, COMPLETIONS
from tokenomy.gateway.http.flight import JsonBytes
from tokenomy.gateway.http.messages_adapter import MESSAGES
from tokenomy.gateway.http.openapi import spec
from tokenomy.gateway.http.proxy import Proxy
from tokenomy.gateway.http.response_chain import ANSWER_TTL_S, ResponseChain
from tokenomy.gateway.http.responses_adapter import RESPONSES
from tokenomy.gateway.metering.ledger import Ledger
from tokenomy.gateway.metering.prom import CONTENT_TYPE, GatewayMetrics
from tokenomy.gateway.metering.usage_api import usage_endpoint
from tokenomy.gateway.ops import build as ops_build
from tokenomy.gateway.ops.admin import build_admin_router
from tokenomy.gateway.ops.budget_metrics import BudgetGauges
from tokenomy.gateway.ops.config import ops_config
from tokenomy.gateway.ops.fleet import build_fleet
from tokenomy.gateway.ops.guard import Guard
from tokenomy.gateway.routing.ampd_live import AmpdRouting
from tokenomy.gateway.routing.backends import BackendPool
from tokenomy.gateway.routing.build import build_routing
from tokenomy.gateway.routing.fleet_load import FleetLoad
from tokenomy.gateway.routing.tls import host_port, tls_contexts
from tokenomy.gateway.routing.upstream import Upstream, UpstreamTimeouts
from tokenomy.gateway.routing.upstream_pool import UpstreamPool
from tokenomy.gateway.stores.answers_sql import SqlAnswers
from tokenomy.gateway.stores.ledger_sql import SqlLedger
from tokenomy.gateway.stores.outbox_ledger import OutboxLedger
from tokenomy.gateway.stores.redis_routing import RedisInFlight, RedisSessionBindings
from tokenomy.policy.router import make_router

log = logging.getLogger(__name__)


def _error_response(err: GatewayError) -> JSONResponse:
    return JSONResponse(err.body(), err.status, headers=err.headers)


async def _on_gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    request.app.state.metrics.errors.labels(exc.code or exc.type).inc()
    return _error_response(exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else "http_error"
    msg = f"{request.method} {request.url.path}: {exc.detail}"
    return _error_response(GatewayError(exc.status_code, msg, "invalid_request_error", kind))


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s", request.url.path)
    return _error_response(GatewayError(500, "internal gateway error", "server_error", "internal_error"))


def build_guard(config: GatewayConfig, metrics: GatewayMetrics, ledger: Ledger) -> tuple[Guard, Router]:
    """Token operations' guard and its admin router.

    Holds a previous process left (a crash) are reconciled against the ledger at startup.
    """
    guard = ops_build.build_guard(config, db_url=config.ledger.url, registry=metrics.registry,
                                  ledger_cost_usd=ledger.cost_usd)
    return guard, build_admin_router(guard)


def build_upstream(config: GatewayConfig, tls: dict[tuple[str, int], Any]) -> Upstream:
    """The hot-path client ``server.upstream_client`` names, with the per-phase timeouts and
    connection caps of the config (see :mod:`tokenomy.gateway.routing.upstream_pool` for the choice)."""
    s = config.server
    t = s.timeouts
    timeouts = UpstreamTimeouts(connect_s=t.connect_s, headers_s=t.headers_s, chunk_gap_s=t.chunk_gap_s)
    if s.upstream_client == "aiohttp":
        from tokenomy.gateway.routing.upstream_aiohttp import AiohttpUpstream  # only when chosen

        return AiohttpUpstream(timeouts, s.max_connections_per_backend, tls)
    caps = {host_port(b.url): b.max_connections for b in config.backends if b.max_connections is not None}
    return UpstreamPool(timeouts, s.max_connections_per_backend, tls, caps)


def _console(guard: Any, ledger: Ledger, pool: BackendPool, routing: Any) -> Any:
    """The operator's console (docs/console.md), on the same guard, ledger and backends; None
    when the ledger is not an SQL one (the console reads it with SQL)."""
    from tokenomy.gateway.console import ConsoleDeps, ConsoleQueries, build_console

    engine = getattr(ledger, "sync_engine", None) or getattr(ledger, "engine", None)  # a fleet's: psycopg
    if not isinstance(engine, sa.Engine):
        log.warning("console off: the ledger %s has no SQL engine", type(ledger).__name__)
        return None
    ampd = routing.live if isinstance(routing, AmpdRouting) else None
    return build_console(ConsoleDeps(guard, ConsoleQueries(engine), pool, ampd, getattr(ledger, "outbox", None)))


def _answer_rows(ledger: Ledger) -> SqlAnswers | None:
    """Stored Responses answers in the ledger's database (None: in the process, for a ledger
    without a synchronous SQL engine)."""
    engine = getattr(ledger, "sync_engine", None) or getattr(ledger, "engine", None)
    return SqlAnswers(engine, ANSWER_TTL_S) if isinstance(engine, sa.Engine) else None


class _Incoming:
    """The request as the proxy reads it: headers (lower-case names; the first of repeated ones)
    decoded once into a dict, and the ASGI ``receive``. Cheaper than a Starlette ``Request``."""

    __slots__ = ("headers", "receive")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(scope["headers"])}
        self.receive = receive


FRONT_DOOR: dict[str, Adapter] = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS,
                                  "/v1/messages": MESSAGES, "/v1/responses": RESPONSES}
"""The generation routes and their protocols' adapters (one chain for all: http.proxy)."""
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


def _protocol_error(adapter: Adapter, err: GatewayError) -> Response:
    body, status, headers = adapter.error(err)
    return JsonBytes(body, status, headers)


class GatewayApp:
    """The ASGI app: the generation routes go straight to the proxy (no routing table, no
    middleware stack, no Starlette ``Request``: ~15% of a request's CPU); everything else,
    lifespan included, to Starlette. Errors on a protocol's routes answer in its shape."""

    def __init__(self, app: Starlette, proxy: Proxy) -> None:
        self.app = app
        self.proxy = proxy
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        adapter = FRONT_DOOR.get(path)
        if path == COUNT_TOKENS_PATH:
            adapter = MESSAGES
        if adapter is None or scope["method"] != "POST":
            if path == "/v1/messages" or path == "/v1/responses" or path == COUNT_TOKENS_PATH:
                await _protocol_error(FRONT_DOOR.get(path, MESSAGES), GatewayError(
                    405, f"{scope.get('method')} {path}: Method Not Allowed", "invalid_request_error",
                    "method_not_allowed"))(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        incoming = _Incoming(scope, receive)
        try:
            if path == COUNT_TOKENS_PATH:
                response = await self.proxy.count_tokens(incoming)
            else:
                response = await self.proxy.handle(incoming, adapter)
        except GatewayError as err:
            self.proxy.metrics.errors.labels(err.code or err.type).inc()
            response = _protocol_error(adapter, err)
        except Exception:
            log.exception("unexpected error on %s", scope["path"])
            response = _protocol_error(adapter, GatewayError(500, "internal gateway error", "server_error",
                                                             "internal_error"))
        await response(scope, receive, send)


def build_app(
    config: GatewayConfig,
    guard: Guard | None = None,
    ledger: Ledger | None = None,
    admin: Any = None,
) -> GatewayApp:
    metrics = GatewayMetrics()
    fleet = None
    shared = ops_config(config).shared if guard is None and ledger is None else None
    if shared is not None:  # a fleet replica: ledger and tenants in PostgreSQL, state in Redis
        fleet = build_fleet(config, shared, registry=metrics.registry)
        ledger, guard, admin = fleet.ledger, fleet.guard, build_admin_router(fleet.guard)
    own_ledger = ledger is None
    the_ledger: Ledger = ledger if ledger is not None else SqlLedger(
        config.ledger.url, config.ledger.synchronous, config.ledger.max_batch, config.ledger.writer
    )
    if guard is None:
        guard, admin = build_guard(config, metrics, the_ledger)
    tls = tls_contexts(config.backends)
    # httpx only for health checks and scrapes (one client per https backend: its own trust); the
    # hot path uses UpstreamPool
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=2 * len(config.backends)), trust_env=False)
    tls_clients = {b.id: httpx.AsyncClient(verify=tls[host_port(b.url)], trust_env=False)
                   for b in config.backends if host_port(b.url) in tls}
    pool = BackendPool(config.backends, config.health, client, tls_clients)
    router = make_router(config.router.name, **config.router.options)
    upstream = build_upstream(config, tls)
    routing = build_routing(config.routing, pool, upstream, router, client)
    if isinstance(routing, AmpdRouting):
        metrics.watch_ampd(routing.live)
        if fleet is not None and shared is not None:  # one session, one decode instance, fleet-wide
            routing.live.bindings = RedisSessionBindings(fleet.redis, ttl_s=shared.binding_ttl_s)
    fleet_load = None  # a fleet: routers read every replica's in-flight counts, refreshed off the request path
    if fleet is not None and shared is not None:
        fleet_load = FleetLoad(pool, RedisInFlight(fleet.redis, fleet.owner, shared.in_flight_lease_s),
                               shared.in_flight_period_s)
    proxy = Proxy(config, pool, routing, the_ledger, guard, metrics, upstream, ResponseChain(_answer_rows(the_ledger)))
    openapi = spec(config.models())

    async def chat(request: Request) -> Response:
        return await proxy.handle(request, CHAT)

    async def completions(request: Request) -> Response:
        return await proxy.handle(request, COMPLETIONS)

    async def models(request: Request) -> Response:
        created = int(time.time())
        data: list[dict[str, Any]] = [{"id": m, "object": "model", "created": created, "owned_by": "tokenomy"}
                                      for m in config.models()]
        data += [{"id": alias, "object": "model", "created": created, "owned_by": "tokenomy", "root": served}
                 for alias, served in proxy.aliases.listed()]
        aliases = [{"match": a.match, "model": a.model, **({"tenants": list(a.tenants)} if a.tenants else {})}
                   for a in config.aliases]
        return JSONResponse({"object": "list", "data": data, "aliases": aliases})

    async def health(request: Request) -> Response:
        status = {b.instance_id: b.healthy for b in pool.backends}
        ok = any(status.values())
        body: dict[str, Any] = {"status": "ok" if ok else "no healthy backend", "backends": status}
        if isinstance(the_ledger, OutboxLedger):  # a fleet replica: events not yet in PostgreSQL
            body["ledger_outbox"] = the_ledger.outbox.stats()
        return JSONResponse(body, 200 if ok else 503)

    gauges: BudgetGauges | None = None  # with token operations: the budget gauges (read from their store)

    async def prometheus(request: Request) -> Response:
        if gauges is not None:
            await gauges.refresh()
        for b in pool.backends:
            metrics.in_flight.labels(b.instance_id).set(b.own_in_flight)
            metrics.fleet_in_flight.labels(b.instance_id).set(b.in_flight)
            metrics.healthy.labels(b.instance_id).set(1 if b.healthy else 0)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def usage(request: Request) -> Response:
        scope_of = guard if hasattr(guard, "usage_scope") else None
        if scope_of is None:
            raise GatewayError(501, "this guard cannot authorize usage reads", "server_error", "not_supported")
        return await usage_endpoint(request, the_ledger, scope_of)  # type: ignore[arg-type]

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(openapi)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if fleet is not None:
            await fleet.start()
        pool.start()
        if fleet_load is not None:
            fleet_load.start()
        gc.collect()
        gc.freeze()  # start-up objects live as long as the process: the collector need not scan them
        try:
            yield
        finally:
            await pool.stop()
            if fleet_load is not None:
                await fleet_load.stop()
            for task in list(proxy.completion.background):
                with contextlib.suppress(Exception):
                    await task
            await client.aclose()
            for c in tls_clients.values():
                await c.aclose()
            await upstream.aclose()
            if fleet is not None:
                await fleet.aclose()
            elif (aclose := getattr(guard, "aclose", None)) is not None:
                await aclose()  # token operations: post queued alerts, stop the webhook
            if own_ledger:
                the_ledger.close()

    routes: list[Any] = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/usage", usage, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]
    if admin is not None:
        routes.append(Mount("/admin", app=admin))
        console = _console(guard, the_ledger, pool, routing)
        if console is not None:
            routes.append(Mount("/console", app=console))
        gauges = BudgetGauges(guard)
        metrics.registry.register(gauges)
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={GatewayError: _on_gateway_error, HTTPException: _on_http_error, Exception: _on_unexpected},
    )
    app.state.proxy = proxy
    app.state.pool = pool
    app.state.ledger = the_ledger
    app.state.metrics = metrics
    app.state.guard = guard
    return GatewayApp(app, proxy)
