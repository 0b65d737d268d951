"""The operator's console, mounted at ``/console`` on the gateway (docs/console.md).

Server-rendered pages (Jinja2 templates and one stylesheet, shipped in this package; charts are
inline SVG, no JavaScript), behind the admin key (:mod:`.auth`): the key tree with its budgets
and edits (:mod:`.tenants`), spend over time and sessions, live sessions and events, the cluster
and AMPD's decisions (:mod:`.views`). Reads of the ledger are aggregated and paginated
(:mod:`.queries`).
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tokenomy.gateway.console import tenants, views
from tokenomy.gateway.console.auth import COOKIE, ConsoleAuth
from tokenomy.gateway.console.queries import ConsoleQueries
from tokenomy.gateway.console.web import ConsoleDeps, read_form, render, signed_in

__all__ = ["ConsoleDeps", "ConsoleQueries", "build_console"]


async def _login_form(request: Request) -> Response:
    auth: ConsoleAuth = request.app.state.auth
    if not auth.enabled:
        return render(request, "error.html", 404, message="The console is off: set ops.admin_key in the "
                                                          "gateway's config.")
    return render(request, "login.html")


async def _login(request: Request) -> Response:
    auth: ConsoleAuth = request.app.state.auth
    form = await read_form(request)
    cookie = auth.login(str(form.get("admin_key", "")))
    if cookie is None:
        return render(request, "login.html", 401, error="That is not the admin key.")
    root = request.scope.get("root_path", "")
    response = RedirectResponse(root + "/tenants", 303)
    response.set_cookie(COOKIE, cookie, max_age=int(auth.ttl_s), path=root or "/", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


@signed_in
async def _logout(request: Request) -> Response:
    root = request.scope.get("root_path", "")
    response = RedirectResponse(root + "/login", 303)
    response.delete_cookie(COOKIE, path=root or "/")
    return response


async def _index(request: Request) -> Response:
    return RedirectResponse(request.scope.get("root_path", "") + "/tenants", 303)


def build_console(deps: ConsoleDeps, auth: ConsoleAuth | None = None) -> Starlette:
    """The console app for ``Mount("/console", ...)``; ``deps.queries.prepare()`` is called here
    (it creates the ledger's time index when missing)."""
    deps.queries.prepare()
    guard = deps.guard
    routes: list[Any] = [
        Route("/", _index),
        Route("/login", _login_form, methods=["GET"]),
        Route("/login", _login, methods=["POST"]),
        Route("/logout", _logout, methods=["POST"]),
        Route("/tenants", tenants.tenants, methods=["GET"]),
        Route("/tenants/keys", tenants.create_key, methods=["POST"]),
        Route("/tenants/{node_id}/budget", tenants.set_budget, methods=["POST"]),
        Route("/tenants/{node_id}/revoke", tenants.revoke, methods=["POST"]),
        Route("/spend", views.spend),
        Route("/session", views.session),
        Route("/live", views.live),
        Route("/cluster", views.cluster),
        Mount("/static", app=StaticFiles(packages=[("tokenomy.gateway.console", "static")]), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.deps = deps
    app.state.auth = auth or ConsoleAuth(lambda: guard.config.admin_key, guard.is_admin, guard.clock)
    return app
