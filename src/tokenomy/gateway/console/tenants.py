"""The org → team → key tree: limits, budgets and spend, and its three edits (create a key, set a
budget, revoke), made through the same :class:`~tokenomy.gateway.stores.tenancy_sql.TenantStore`
methods the admin API and ``tokenomy keys`` / ``tokenomy tenants`` call."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from tokenomy.gateway.console.web import ConsoleDeps, off_loop, render, signed_in
from tokenomy.gateway.ops.budget import period_key
from tokenomy.gateway.ops.tenancy import NodeKind, NodeLimits


@dataclass
class TreeRow:
    node: Any
    depth: int
    path: str
    spent_usd: float  # this budget period (the node's own period; month when it has no budget)
    held_usd: float
    hint: str = ""
    label: str = ""  # the path by names: "acme / agents"

    @property
    def used(self) -> float | None:
        b = self.node.limits.budget_usd
        return None if not b else min(1.0, self.spent_usd / b)

    @property
    def limits_text(self) -> str:
        lim = self.node.limits.model_dump(exclude_defaults=True, exclude={"budget_usd", "budget_period"})
        return ", ".join(f"{k}={v}" for k, v in lim.items())


def _period_starts(now_s: float) -> tuple[float, float]:
    d = datetime.fromtimestamp(now_s, UTC)
    day = d.replace(hour=0, minute=0, second=0, microsecond=0)
    return day.replace(day=1).timestamp(), day.timestamp()


def tree_rows(deps: ConsoleDeps, spend: dict[str, tuple[float, float]],
              held: dict[tuple[str, str], tuple[float, float]]) -> list[TreeRow]:
    """Depth-first rows, orgs by name, with spend rolled up from the ledger's tenant paths."""
    guard = deps.guard
    tree = guard.store.tree
    hints = guard.store.key_hints()
    now = guard.clock()
    out: list[TreeRow] = []

    def visit(node: Any, depth: int) -> None:
        path = "/".join(tree.path(node.id))
        month = day = 0.0
        for p, (m, d) in spend.items():
            if p == path or p.startswith(path + "/"):
                month, day = month + m, day + d
        period = node.limits.budget_period
        held_usd = held.get((node.id, period_key(period, now)), (0.0, 0.0))[1] if node.limits.budget_usd else 0.0
        label = " / ".join(tree.get(i).name for i in tree.path(node.id))
        out.append(TreeRow(node, depth, path, day if period == "day" else month, held_usd, hints.get(node.id, ""), label))
        for child in sorted(tree.children(node.id), key=lambda n: (n.kind.value, n.name, n.id)):
            visit(child, depth + 1)

    for org in sorted((n for n in tree.nodes() if n.parent_id is None), key=lambda n: (n.name, n.id)):
        visit(org, 0)
    return out


async def _page(request: Request, status: int = 200, **ctx: Any) -> Response:
    deps: ConsoleDeps = request.app.state.deps
    store = deps.guard.store
    store.refresh_if_changed()
    spend = await off_loop(deps.queries.period_spend, *_period_starts(deps.guard.clock()))
    now = deps.guard.clock()
    held = await deps.guard.budget_usage([(n.id, period_key(n.limits.budget_period, now)) for n in store.tree.nodes()
                                          if n.limits.budget_usd is not None])  # a fleet's: the shared store
    rows = tree_rows(deps, spend, held)
    teams = [r for r in rows if r.node.kind is NodeKind.TEAM and not r.node.revoked]
    ctx.setdefault("message", request.query_params.get("msg"))
    return render(request, "tenants.html", status, active="tenants", rows=rows, teams=teams, **ctx)


def _budget(raw: Any) -> float | None:
    text = str(raw or "").strip()
    if not text:
        return None
    value = float(text)  # ValueError: reported by the caller
    if not math.isfinite(value) or value < 0:
        raise ValueError("a budget is a non-negative number of dollars")
    return value


@signed_in
async def tenants(request: Request) -> Response:
    return await _page(request)


@signed_in
async def create_key(request: Request) -> Response:
    form: dict[str, str] = request.state.form
    store = request.app.state.deps.guard.store
    try:
        data: dict[str, Any] = {"budget_usd": _budget(form.get("budget_usd")),
                                "budget_period": form.get("budget_period") or "month"}
        node, raw = store.create_key(str(form.get("team_id", "")), str(form.get("name", "")).strip() or "key",
                                     NodeLimits.model_validate(data))
    except (ValueError, KeyError, ValidationError) as exc:
        return await _page(request, 400, error=_why(exc))
    return await _page(request, new_key={"id": node.id, "name": node.name, "raw": raw})


@signed_in
async def set_budget(request: Request) -> Response:
    form: dict[str, str] = request.state.form
    store = request.app.state.deps.guard.store
    node_id = request.path_params["node_id"]
    try:
        node = store.tree.get(node_id)
        limits = NodeLimits.model_validate({**node.limits.model_dump(), "budget_usd": _budget(form.get("budget_usd")),
                                            "budget_period": form.get("budget_period") or node.limits.budget_period})
        store.update_limits(node_id, limits)
    except (ValueError, KeyError, ValidationError) as exc:
        return await _page(request, 400, error=_why(exc))
    return _back(request, f"budget of {node.name} set")


@signed_in
async def revoke(request: Request) -> Response:
    store = request.app.state.deps.guard.store
    try:
        node = store.revoke(request.path_params["node_id"])
    except KeyError as exc:
        return await _page(request, 404, error=_why(exc))
    return _back(request, f"{node.kind.value} {node.name} revoked")


def _back(request: Request, message: str) -> Response:
    """Post/redirect/get: back to the tree with ``message`` shown."""
    return RedirectResponse(f"{request.scope.get('root_path', '')}/tenants?{urlencode({'msg': message})}", 303)


def _why(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        return f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
    if isinstance(exc, KeyError):
        return f"no such node: {exc.args[0] if exc.args else ''}"
    return str(exc)
