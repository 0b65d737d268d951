"""The console's read-only pages: spend over time, one session's turns, live sessions and
events, the cluster and AMPD's decisions."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tokenomy.gateway.console.charts import stacked_bars
from tokenomy.gateway.console.queries import COST_CLASSES, TOKEN_CLASSES
from tokenomy.gateway.console.web import ConsoleDeps, off_loop, page_of, render, signed_in

# window name -> (span, bucket) in seconds
WINDOWS = {"15m": (900.0, 30.0), "1h": (3600.0, 120.0), "6h": (6 * 3600.0, 900.0), "24h": (86_400.0, 3600.0),
           "7d": (7 * 86_400.0, 6 * 3600.0)}
LIVE_WINDOW_S = 900.0  # a session with a turn in the last 15 minutes counts as live
_COST_NAMES = {"cost_recomputed_usd": "prefill, recomputed", "cost_cached_usd": "prefill, cached",
               "cost_output_usd": "output"}
_TOKEN_NAMES = {"input_tokens": "input", "incremental_prefill_tokens": "incremental prefill",
                "history_tokens": "history (re-sent)", "output_tokens": "output"}


def _labels(since_s: float, bucket_s: float, n: int) -> list[str]:
    fmt = "%H:%M" if bucket_s < 86_400 else "%m-%d"
    return [time.strftime(fmt, time.gmtime(since_s + i * bucket_s)) for i in range(n)]


def _org_names(deps: ConsoleDeps) -> dict[str, str]:
    tree = deps.guard.store.tree
    return {n.id: n.name for n in tree.nodes() if n.parent_id is None}


def tenant_names(deps: ConsoleDeps) -> dict[str, str]:
    """Node id -> name, to show ``org_…/team_…/key_…`` paths as ``acme / agents / ci-bot``."""
    return {n.id: n.name for n in deps.guard.store.tree.nodes()}


@signed_in
async def spend(request: Request) -> Response:
    deps: ConsoleDeps = request.app.state.deps
    window = request.query_params.get("window", "1h")
    span_s, bucket_s = WINDOWS.get(window, WINDOWS["1h"])
    window = window if window in WINDOWS else "1h"
    now = deps.guard.clock()
    n = int(span_s // bucket_s)
    since = now - n * bucket_s
    rows = await off_loop(deps.queries.spend, since, now + 1e-6, bucket_s)
    top = await off_loop(deps.queries.top_sessions, since, page_of(request))
    names = _org_names(deps)
    by_org: dict[str, list[float]] = {}
    by_class = {name: [0.0] * n for name in _COST_NAMES.values()}
    by_tokens = {name: [0.0] * n for name in _TOKEN_NAMES.values()}
    savings = [0.0] * n
    totals: defaultdict[str, float] = defaultdict(float)
    for r in rows:
        b = min(max(r.bucket, 0), n - 1)
        org = names.get(r.tenant_path.split("/")[0], r.tenant_path.split("/")[0])
        by_org.setdefault(org, [0.0] * n)[b] += sum(r.costs.values())
        for cls in COST_CLASSES:
            by_class[_COST_NAMES[cls]][b] += r.costs[cls]
            totals[cls] += r.costs[cls]
        for cls in TOKEN_CLASSES:
            if cls in _TOKEN_NAMES:
                by_tokens[_TOKEN_NAMES[cls]][b] += r.tokens[cls]
            totals[cls] += r.tokens[cls]
        savings[b] += r.savings_usd
        totals["savings"] += r.savings_usd
        totals["requests"] += r.requests
    labels = _labels(since, bucket_s, n)
    charts = [stacked_bars("Spend by org", labels, dict(sorted(by_org.items())), "$"),
              stacked_bars("Spend by token class", labels, by_class, "$"),
              stacked_bars("Tokens by class", labels, by_tokens),
              stacked_bars("What the prefix cache saved", labels, {"cache savings": savings}, "$")]
    org_totals = sorted(((k, sum(v)) for k, v in by_org.items()), key=lambda kv: -kv[1])
    return render(request, "spend.html", active="spend", window=window, windows=list(WINDOWS), charts=charts,
                  totals=totals, org_totals=org_totals, top=top, names=tenant_names(deps), spent=sum(totals[c] for c in COST_CLASSES))


@signed_in
async def session(request: Request) -> Response:
    deps: ConsoleDeps = request.app.state.deps
    key_id = request.query_params.get("key", "")
    sid = request.query_params.get("id", "")
    turns = await off_loop(deps.queries.turns, key_id, sid) if key_id and sid else []
    status = 200 if turns else 404
    return render(request, "session.html", status, active="spend", key_id=key_id, session_id=sid, turns=turns,
                  names=tenant_names(deps),
                  total=sum(t["cost_usd"] for t in turns), saved=sum(t["cache_savings_usd"] for t in turns))


def _bound(deps: ConsoleDeps, session_id: str) -> str | None:
    binder = getattr(getattr(deps.ampd, "policies", None), "binder", None)
    return None if binder is None else binder.bound_instance(session_id)


@signed_in
async def live(request: Request) -> Response:
    deps: ConsoleDeps = request.app.state.deps
    now = deps.guard.clock()
    page = await off_loop(deps.queries.recent_sessions, now - LIVE_WINDOW_S, page_of(request))
    sessions: list[dict[str, Any]] = []
    for s in page.rows:
        backend = _bound(deps, s.session_id) or await off_loop(deps.queries.last_backend, s.key_id, s.session_id)
        breaker = deps.guard.breakers.session_status(s.key_id, s.session_id, now)
        sessions.append({"row": s, "backend": backend, "breaker": breaker})
    events = sorted(deps.guard.alerter.recent, key=lambda a: -a.at_s)
    return render(request, "live.html", active="live", sessions=sessions, page=page, events=events,
                  names=tenant_names(deps),
                  window_min=int(LIVE_WINDOW_S // 60))


@signed_in
async def cluster(request: Request) -> Response:
    deps: ConsoleDeps = request.app.state.deps
    backends = list(deps.backends.backends)
    charts: list[Any] = []
    gates: list[dict[str, Any]] = []
    if deps.ampd is not None:
        starts, series = deps.ampd.counts.series(time.monotonic())
        labels = [f"{int(t)}s" for t in starts]
        charts = [stacked_bars("AMPD placements (last 10 min)", labels,
                               {k: series[k] for k in ("local prefill", "remote prefill")}),
                  stacked_bars("Prefill queue reorders and deferrals", labels,
                               {k: series[k] for k in ("reorders", "deferrals")})]
        for kind, by_backend in (("prefill queue", deps.ampd.queues), ("decode gate", deps.ampd.gates)):
            for backend_id, g in sorted(by_backend.items()):
                gates.append({"kind": kind, "backend": backend_id, "waiting": len(g.tasks), "held": g.held,
                              "reordered": getattr(g, "reordered", None)})
    outbox = deps.outbox.stats() if deps.outbox is not None else None
    return render(request, "cluster.html", active="cluster", backends=backends, charts=charts, gates=gates,
                  ampd=deps.ampd is not None, outbox=outbox)
