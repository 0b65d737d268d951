"""The chaos run's audit, read after the load stopped and every replica's outbox drained.

* Every request a client saw complete is in the ledger exactly once (``lost``: not there;
  ``misrecorded``: there with another outcome), and nothing else is (``extra``: an ``ok`` event
  no client saw complete, or an event for an id no client sent). ``duplicated``: ids in
  ``usage_events`` more than once, or in PostgreSQL and still in an outbox file.
  A request whose answer broke off (``read_error``: its replica was killed) is either billed
  (``recorded_then_cut``: the commit came first) or not (``unmetered_cut``: the replica died
  with it in flight; the engine may have computed tokens no replica lived to meter).
* The ledger's tokens per class equal the backends' own counters (vLLM's
  ``prompt_tokens_total``, ``generation_tokens_total``, ``prompt_tokens_cached_total``), summed
  over each engine process's life (a killed engine's counters are read just before the kill),
  in all and per backend (``ledger_vs_backends_diff_by_backend``: where a difference lies, with
  that backend's ledger tokens by outcome; a pre-kill read that failed is named in the run's
  ``lost_counter_reads``, and that life's tokens are missing from its backend's counters).
* No budget node's ledger spend exceeds its budget; no hold is left in Redis.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from redis import Redis

from tokenomy.chaos.load import Request
from tokenomy.gateway.routing.backends import parse_prometheus
from tokenomy.gateway.stores.pg_tenancy import pg_engine

COUNTERS = {"prompt": "vllm:prompt_tokens_total", "output": "vllm:generation_tokens_total",
            "cached": "vllm:prompt_tokens_cached_total"}
"""Ledger token class -> the engine counter it must equal."""
TRANSPORT_FAILURES = frozenset({"read_error", "timeout", "bad_stream"})
"""Client outcomes of a request that went out and whose answer broke off (the bench's names)."""


def scrape_counters(url: str) -> dict[str, float]:
    """The engine at ``url``'s token counters (by ledger class)."""
    got = parse_prometheus(httpx.get(url + "/metrics", timeout=10.0).text)
    return {cls: got.get(name, 0.0) for cls, name in COUNTERS.items()}


@dataclass(frozen=True)
class LedgerRow:
    request_id: str
    tenant_path: str
    backend: str
    outcome: str
    prompt: int
    output: int
    cached: int
    cost_usd: float


def read_ledger(pg_url: str) -> list[LedgerRow]:
    engine = pg_engine(pg_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT request_id, tenant_path, backend, outcome, prompt_tokens, "
                                        "output_tokens, cached_tokens, cost_usd FROM usage_events")).all()
    finally:
        engine.dispose()
    return [LedgerRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]), int(r[5]), int(r[6]), float(r[7]))
            for r in rows]


def read_budgets(pg_url: str) -> dict[str, tuple[str, float]]:
    """Node id -> (name, budget in USD) of every node that has a budget."""
    engine = pg_engine(pg_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT id, name, limits_json FROM tk_nodes")).all()
    finally:
        engine.dispose()
    out: dict[str, tuple[str, float]] = {}
    for node_id, name, limits in rows:
        budget = json.loads(limits or "{}").get("budget_usd")
        if budget is not None:
            out[str(node_id)] = (str(name), float(budget))
    return out


def holds_left(redis_url: str) -> int:
    """Budget holds still in Redis (``tk:holds`` and ``tk:hold:*``)."""
    r = Redis.from_url(redis_url)
    try:
        return int(r.zcard("tk:holds")) + sum(1 for _ in r.scan_iter("tk:hold:*", count=1000))
    finally:
        r.close()


def outbox_ids(directory: Path) -> list[str]:
    """Request ids still in the ledger outbox files under ``directory``."""
    ids: list[str] = []
    for path in sorted(directory.glob("tokenomy-outbox-*.db")):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            ids += [str(r[0]) for r in conn.execute("SELECT request_id FROM outbox")]
        except sqlite3.OperationalError:
            pass  # never created its table
        finally:
            conn.close()
    return ids


def _tokens_by_outcome(rows: Iterable[LedgerRow]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNTERS, 0))
    for row in rows:
        for cls, n in (("prompt", row.prompt), ("output", row.output), ("cached", row.cached)):
            out[row.outcome][cls] += n
    return dict(out)


def audit(requests: Iterable[Request], ledger: list[LedgerRow], budgets: dict[str, tuple[str, float]],
          counters: dict[str, dict[str, float]], holds: int, queued: list[str]) -> dict[str, Any]:
    """The audit's figures (see the module docstring); ``counters``: each backend's (by its
    instance id) engine totals by ledger class, over all its processes' lives."""
    sent = {r.request_id: r for r in requests}
    complete = {rid for rid, r in sent.items() if r.complete}
    per_id = Counter(row.request_id for row in ledger)
    by_id = {row.request_id: row for row in ledger}
    duplicated = sum(n - 1 for n in per_id.values() if n > 1) + len(set(queued) & set(per_id))
    lost = sorted(complete - set(per_id))
    misrecorded = sorted(rid for rid in complete & set(per_id) if by_id[rid].outcome != "ok")
    # An ok event whose client saw the connection break (a replica killed between its ledger commit and
    # the stream's end) is billed as promised: durable before completion. Anything else ok is extra.
    cut = {rid for rid, r in sent.items() if r.status in TRANSPORT_FAILURES}
    extra = sorted(f"{rid} ({sent[rid].status if rid in sent else 'never sent'})" for rid, row in by_id.items()
                   if rid not in sent or (row.outcome == "ok" and rid not in complete and rid not in cut))
    recorded_then_cut = sorted(rid for rid in cut & set(per_id) if by_id[rid].outcome == "ok")
    unmetered_cut = sorted(rid for rid in cut - set(per_id) if not sent[rid].disconnected)
    ledger_tokens = {"prompt": sum(r.prompt for r in ledger), "output": sum(r.output for r in ledger),
                     "cached": sum(r.cached for r in ledger)}
    totals = {cls: sum(c.get(cls, 0.0) for c in counters.values()) for cls in COUNTERS}
    diff = {cls: ledger_tokens[cls] - round(totals[cls]) for cls in COUNTERS}
    rows_by_backend: dict[str, list[LedgerRow]] = defaultdict(list)
    for row in ledger:
        rows_by_backend[row.backend].append(row)
    by_backend = {}
    for backend in sorted(set(counters) | set(rows_by_backend)):
        rows = rows_by_backend.get(backend, [])
        got = counters.get(backend, {})
        by_backend[backend] = {
            "diff": {cls: sum(getattr(r, cls) for r in rows) - round(got.get(cls, 0.0)) for cls in COUNTERS},
            "ledger_tokens_by_outcome": _tokens_by_outcome(rows)}
    spend: dict[str, float] = defaultdict(float)
    for row in ledger:
        for node in row.tenant_path.split("/"):
            spend[node] += row.cost_usd
    over = {name: round(spend[node] - budget, 9) for node, (name, budget) in budgets.items()
            if spend[node] > budget + 1e-9}
    return {
        "lost": len(lost), "misrecorded": len(misrecorded), "extra": len(extra), "duplicated": duplicated,
        "lost_ids": lost[:20], "misrecorded_ids": misrecorded[:20], "extra_ids": extra[:20],
        "recorded_then_cut": len(recorded_then_cut), "unmetered_cut": len(unmetered_cut),
        "unmetered_cut_ids": unmetered_cut[:20],
        "ledger_events": len(ledger), "ledger_outcomes": dict(Counter(r.outcome for r in ledger)),
        "ledger_tokens": ledger_tokens, "ledger_tokens_by_outcome": _tokens_by_outcome(ledger),
        "backend_tokens": {k: round(v) for k, v in totals.items()},
        "ledger_vs_backends_diff_tokens": diff, "ledger_vs_backends_diff_by_backend": by_backend,
        "ledger_vs_backends_max_diff_tokens": max(abs(v) for v in diff.values()),
        "overspend_usd": round(sum(over.values()), 9), "overspent_nodes": over,
        "budget_spend_usd": {name: round(spend[node], 6) for node, (name, _) in budgets.items()},
        "holds_left": holds, "outbox_left": len(queued),
    }
