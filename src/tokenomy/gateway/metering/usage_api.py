"""``GET /v1/usage``: ledger events of the caller's subtree, as JSON or CSV.

Query parameters (all optional): ``tenant`` (a tenant path ``org/team[/key]`` inside the caller's
own subtree), ``key``, ``model``, ``session``, ``since`` and ``until`` (Unix seconds or ISO 8601),
``format`` (``json`` or ``csv``), ``limit`` (1-100000, default 10000).
"""

from __future__ import annotations

import asyncio
import csv
import io
from dataclasses import asdict, fields
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.metering.ledger import Ledger, UsageEvent, UsageFilter
from tokenomy.gateway.ops.guard import UsageScope

_COLUMNS = [f.name for f in fields(UsageEvent)]
_SUMMED = (
    "prompt_tokens", "input_tokens", "incremental_prefill_tokens", "history_tokens", "output_tokens",
    "cached_tokens", "recomputed_tokens", "reasoning_tokens", "cost_usd", "cache_savings_usd",
)


def _bad(message: str, param: str) -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", "invalid_value", param)


def parse_time(value: str | None, param: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise _bad(f"'{param}' must be Unix seconds or an ISO 8601 time, got {value!r}", param) from None


def totals(events: list[UsageEvent]) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": len(events)}
    for name in _SUMMED:
        out[name] = sum(getattr(e, name) for e in events)
    return out


_GROUP_FIELD = {"tenant": "tenant_path", "key": "key_id", "model": "model", "session": "session_id",
                "backend": "backend"}


def group_usage(events: list[UsageEvent], by: str) -> dict[str, dict[str, Any]]:
    """Totals per value of ``by`` (tenant, key, model, session, backend), largest cost first."""
    attr = _GROUP_FIELD[by]
    buckets: dict[str, list[UsageEvent]] = {}
    for e in events:
        buckets.setdefault(str(getattr(e, attr)), []).append(e)
    groups = {k: totals(v) for k, v in buckets.items()}
    return dict(sorted(groups.items(), key=lambda kv: (-kv[1]["cost_usd"], kv[0])))


def to_csv(events: list[UsageEvent]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(_COLUMNS)
    for e in events:
        w.writerow(["" if v is None else v for v in (getattr(e, c) for c in _COLUMNS)])
    return buf.getvalue()


async def usage_endpoint(request: Request, ledger: Ledger, scope_of: UsageScope) -> Response:
    auth = request.headers.get("authorization", "")
    api_key = auth[7:].strip() if auth[:7].lower() == "bearer " else None
    scope = "/".join(await scope_of.usage_scope(api_key))
    q = request.query_params
    tenant = (q.get("tenant") or "").strip("/")
    if tenant and scope and not (tenant == scope or tenant.startswith(scope + "/")):
        raise GatewayError(403, f"this key may read usage under {scope!r} only", "permission_error",
                           "outside_scope", "tenant")
    fmt = q.get("format", "json")
    if fmt not in ("json", "csv"):
        raise _bad(f"'format' must be json or csv, got {fmt!r}", "format")
    limit_s = q.get("limit", "10000")
    if not limit_s.isdigit() or not 1 <= int(limit_s) <= 100_000:
        raise _bad("'limit' must be an integer in [1, 100000]", "limit")
    flt = UsageFilter(
        tenant_prefix=tenant or scope or None,
        key_id=q.get("key") or None,
        model=q.get("model") or None,
        session_id=q.get("session") or None,
        since_s=parse_time(q.get("since"), "since"),
        until_s=parse_time(q.get("until"), "until"),
        limit=int(limit_s),
    )
    events = await asyncio.to_thread(ledger.query, flt)
    if fmt == "csv":
        return Response(to_csv(events), media_type="text/csv")
    return JSONResponse({"object": "list", "data": [asdict(e) for e in events], "totals": totals(events)})
