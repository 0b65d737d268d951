"""The console's plumbing: what it reads from the gateway, templates, and the signed-in wrapper."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import parse_qs

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from tokenomy.gateway.console.auth import COOKIE, ConsoleAuth, same_origin
from tokenomy.gateway.console.queries import ConsoleQueries

Handler = Callable[[Request], Awaitable[Response]]


class OpsLike(Protocol):
    """What the console needs of token operations' guard (``tokenomy.gateway.ops.ops_guard.OpsGuard``)."""

    config: Any  # .admin_key
    store: Any  # TenantStore: tree, key_hints, create_key, update_limits, revoke
    breakers: Any  # Breakers: session_status
    alerter: Any  # Alerter: .recent
    clock: Callable[[], float]

    def is_admin(self, api_key: str | None) -> bool: ...

    async def budget_usage(self, charges: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[float, float]]:
        """(spent, held) of each (node, period): a fleet's from the shared store."""
        ...


@dataclass
class ConsoleDeps:
    """The gateway objects the console reads (and, for tenants, writes through the store)."""

    guard: OpsLike
    queries: ConsoleQueries
    backends: Any  # BackendPool: .backends
    ampd: Any = None  # AmpdLive in ampd mode: .counts, .queues, .gates, .policies.binder
    outbox: Any = None  # a fleet replica's ledger Outbox: .stats() -> depth, oldest_age_s (None: no outbox)


def _env() -> Environment:
    env = Environment(loader=PackageLoader("tokenomy.gateway.console", "templates"),
                      autoescape=select_autoescape(["html"]))
    env.filters["usd"] = lambda v: "—" if v is None else (f"${v:,.4f}" if abs(v) < 100 else f"${v:,.2f}")
    env.filters["int"] = lambda v: f"{int(v):,}"
    env.filters["ts"] = lambda v: datetime.fromtimestamp(v, UTC).strftime("%Y-%m-%d %H:%M:%S")
    env.filters["tenant"] = lambda path, names: " / ".join(names.get(i, i) for i in str(path).split("/"))
    env.filters["pct"] = lambda v: f"{100 * v:.1f}%"
    return env


ENV = _env()


def render(request: Request, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    cookie = request.cookies.get(COOKIE, "")
    auth: ConsoleAuth = request.app.state.auth
    html = ENV.get_template(template).render(
        request=request, csrf=auth.csrf_token(cookie) if cookie else "", root=request.scope.get("root_path", ""),
        **ctx)
    return HTMLResponse(html, status, headers={"cache-control": "no-store", "x-frame-options": "DENY",
                                               "content-security-policy": "default-src 'self'; style-src 'self'"})


def signed_in(handler: Handler) -> Handler:
    """Send visitors without a valid session to the login page; refuse a POST without a matching
    CSRF token or from another origin (403)."""

    async def wrapped(request: Request) -> Response:
        auth: ConsoleAuth = request.app.state.auth
        cookie = request.cookies.get(COOKIE)
        if not auth.valid(cookie):
            return RedirectResponse(request.scope.get("root_path", "") + "/login", 303)
        if request.method == "POST":
            form = await read_form(request)
            request.state.form = form
            origin_ok = same_origin(request.headers.get("origin"), request.headers.get("host"), request.url.scheme)
            token = form.get("csrf")
            if not origin_ok or not auth.csrf_ok(str(cookie), token):
                return render(request, "error.html", 403, message="This form is stale or came from another site: "
                                                                  "reload the page and try again.")
        return await handler(request)

    return wrapped


MAX_FORM_BYTES = 16_384  # the console's forms are a few fields


async def read_form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the console's forms), first value of each
    field; an oversized or other body reads as empty (the handler then refuses it)."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}


async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """A blocking ledger query, in a worker thread."""
    return await asyncio.to_thread(fn, *args)


def page_of(request: Request) -> int:
    raw = request.query_params.get("page", "0")
    return int(raw) if raw.isdigit() and int(raw) < 10_000 else 0
