"""The admin API (mounted under ``/admin``): tenants, keys, revocation, budget usage.

Every route needs ``Authorization: Bearer <ops.admin_key>``; without an admin key configured the
API answers 404. Errors are OpenAI's error JSON. Routes (JSON bodies):

* ``GET  /tenants`` — every node; ``POST /tenants`` ``{"kind": "org"|"team", "name", "parent_id",
  "limits"}`` → 201; ``PATCH /tenants/{id}`` ``{"limits"}``; ``POST /tenants/{id}/revoke``.
* ``GET  /keys`` — keys with a hint (never the key); ``POST /keys`` ``{"team_id", "name", "limits"}``
  → 201 with ``"api_key"``, shown this once; ``POST /keys/{id}/revoke``.
* ``GET  /budget/{id}`` — the node's spend, held reservations and budget this period.

A limit above the parent's, or below a descendant's, is refused with 400 ``limit_exceeds_parent``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.budget import period_key
from tokenomy.gateway.ops.ops_guard import OpsGuard
from tokenomy.gateway.ops.tenancy import NodeKind, NodeLimits
from tokenomy.gateway.stores.tenancy_sql import node_json

Handler = Callable[[Request], Awaitable[Response]]


def _error(err: GatewayError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _body(request: Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise GatewayError(400, "the body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise GatewayError(400, "the body must be a JSON object", code="invalid_json")
    return data


def _limits(data: dict[str, Any]) -> NodeLimits:
    try:
        return NodeLimits.model_validate(data.get("limits") or {})
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        raise GatewayError(400, f"limits.{where}: {e['msg']}", code="invalid_limits", param="limits") from None


def _str(data: dict[str, Any], name: str, required: bool = True) -> str | None:
    value = data.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise GatewayError(400, f"{name!r} must be a non-empty string", code="invalid_field", param=name)
    return value


def build_admin_router(guard: OpsGuard) -> Router:
    store = guard.store

    def admin_only(handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                if guard.config.admin_key is None:
                    raise GatewayError(404, "the admin API is off (set ops.admin_key)", code="admin_disabled")
                auth = request.headers.get("authorization", "")
                token = auth[7:] if auth.lower().startswith("bearer ") else None
                if not guard.is_admin(token):
                    raise GatewayError(401, "admin key required", type="authentication_error",
                                       code="invalid_admin_key")
                return await handler(request)
            except GatewayError as err:
                return _error(err)
            except ValueError as err:  # the store refused: a limit above the parent's, bad parent
                code = "limit_exceeds_parent" if "exceeds" in str(err) or "below" in str(err) else "invalid_request"
                return _error(GatewayError(400, str(err), code=code))
            except KeyError as err:
                return _error(GatewayError(404, str(err.args[0]) if err.args else "not found", code="not_found"))
        return wrapped

    def _node(request: Request) -> str:
        node_id = request.path_params["node_id"]
        store.refresh_if_changed()
        store.tree.get(node_id)  # KeyError → 404
        return str(node_id)

    async def list_tenants(request: Request) -> Response:
        store.refresh_if_changed()
        return JSONResponse({"data": [node_json(n) for n in store.tree.nodes() if n.kind is not NodeKind.KEY]})

    async def create_tenant(request: Request) -> Response:
        data = await _body(request)
        kind = data.get("kind")
        if kind not in ("org", "team"):
            raise GatewayError(400, "'kind' must be 'org' or 'team' (create keys with POST /admin/keys)",
                               code="invalid_field", param="kind")
        node = store.create_node(NodeKind(kind), str(_str(data, "name")), _str(data, "parent_id", kind == "team"),
                                 _limits(data))
        return JSONResponse(node_json(node), status_code=201)

    async def update_tenant(request: Request) -> Response:
        node_id = _node(request)
        return JSONResponse(node_json(store.update_limits(node_id, _limits(await _body(request)))))

    async def revoke(request: Request) -> Response:
        return JSONResponse(node_json(store.revoke(_node(request))))

    async def list_keys(request: Request) -> Response:
        store.refresh_if_changed()
        hints = store.key_hints()
        return JSONResponse({"data": [node_json(n, hints.get(n.id)) for n in store.tree.nodes()
                                      if n.kind is NodeKind.KEY]})

    async def create_key(request: Request) -> Response:
        data = await _body(request)
        node, raw = store.create_key(str(_str(data, "team_id")), str(_str(data, "name")), _limits(data))
        return JSONResponse({**node_json(node), "api_key": raw}, status_code=201)

    async def budget(request: Request) -> Response:
        node = store.tree.get(_node(request))
        period = period_key(node.limits.budget_period, guard.clock())
        spent, reserved = (await guard.budget_usage([(node.id, period)]))[(node.id, period)]
        return JSONResponse({"id": node.id, "period": period, "spent_usd": spent, "reserved_usd": reserved,
                             "budget_usd": node.limits.budget_usd})

    return Router(routes=[
        Route("/tenants", admin_only(list_tenants), methods=["GET"]),
        Route("/tenants", admin_only(create_tenant), methods=["POST"]),
        Route("/tenants/{node_id}", admin_only(update_tenant), methods=["PATCH"]),
        Route("/tenants/{node_id}/revoke", admin_only(revoke), methods=["POST"]),
        Route("/keys", admin_only(list_keys), methods=["GET"]),
        Route("/keys", admin_only(create_key), methods=["POST"]),
        Route("/keys/{node_id}/revoke", admin_only(revoke), methods=["POST"]),
        Route("/budget/{node_id}", admin_only(budget), methods=["GET"]),
    ])
