"""What a chaos or soak run measured besides the audit: availability per fault window and key tier,
the error codes clients got, each replica's RSS over time, latency early and late, the verdicts,
and the table ``benchmarks/chaos.py`` prints."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from tokenomy.chaos.faults import Applied
from tokenomy.chaos.load import Request
from tokenomy.metrics.percentiles import percentile

TARGETS = {"open": 0.99, "budgeted": 0.95}
"""Availability each tier must keep over a PostgreSQL outage (unbudgeted keys 99%, budgeted 95%)."""
RSS_GROWTH_MAX_PCT = 10.0
LATENCY_DRIFT_MAX = 0.10


def _availability(reqs: Sequence[Request]) -> dict[str, Any]:
    by_tier: dict[str, list[Request]] = defaultdict(list)
    for r in reqs:
        by_tier[r.tier].append(r)
    return {tier: {"offered": len(rs), "served": sum(r.complete for r in rs),
                   "availability": round(sum(r.complete for r in rs) / len(rs), 4) if rs else None}
            for tier, rs in sorted(by_tier.items())}


def availability_by_window(requests: Sequence[Request], applied: Sequence[Applied]) -> dict[str, Any]:
    """Requests sent while each fault was in force (``kind@start``), and while none was (``no_fault``),
    by key tier; the hang-up clients are not offered load."""
    load = [r for r in requests if not r.disconnected]
    windows: dict[str, Any] = {}
    covered: set[int] = set()
    for a in sorted(applied, key=lambda a: a.start_s):
        end = a.end_s if a.end_s is not None else float("inf")
        inside = [i for i, r in enumerate(load) if a.start_s <= r.sent_s <= end]
        covered.update(inside)
        windows[f"{a.fault.kind}@{a.start_s:.0f}s"] = {"from_s": round(a.start_s, 1), "to_s": round(end, 1),
                                                      "overlapping": a.fault.overlapping,
                                                      "tiers": _availability([load[i] for i in inside])}
    windows["no_fault"] = {"tiers": _availability([r for i, r in enumerate(load) if i not in covered])}
    return windows


def postgres_outage(requests: Sequence[Request], applied: Sequence[Applied]) -> dict[str, Any]:
    """Availability over every PostgreSQL outage together, by tier, with the verdict per target."""
    stops = [a for a in applied if a.fault.kind == "postgres_stop"]
    inside = [r for r in requests if not r.disconnected
              and any(a.start_s <= r.sent_s <= (a.end_s or float("inf")) for a in stops)]
    tiers = _availability(inside)
    verdict = {t: (tiers.get(t, {}).get("availability") or 0.0) >= target for t, target in TARGETS.items()}
    return {"tiers": tiers, "targets": TARGETS, "met": verdict if stops else None}


def error_codes(requests: Sequence[Request]) -> dict[str, Any]:
    """Tier -> API -> ``status code`` -> how many clients got it, and how many refusals were not in
    their protocol's shape."""
    got: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for r in requests:
        if not r.complete and not r.disconnected:
            got[r.tier][r.api][f"{r.status} {r.code}".strip()] += 1
    return {"by_tier": {t: {a: dict(c.most_common()) for a, c in sorted(apis.items())} for t, apis in sorted(got.items())},
            "not_in_protocol_shape": sum(not r.shape_ok for r in requests)}


def rss_growth(samples: Sequence[tuple[float, list[tuple[int, int] | None]]], warmup_s: float,
               min_span_s: float) -> dict[str, Any]:
    """Per replica process (pid) that lived ``min_span_s`` past its own warm-up (``warmup_s`` from
    its start): its RSS growth
    from the first sample after warm-up to its last, in percent; ``max_pct`` over those."""
    born: dict[int, float] = {}
    lives: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for t, per_replica in samples:
        for s in per_replica:
            if s is None:
                continue
            born.setdefault(s[0], 0.0 if t <= samples[0][0] else t)  # a restarted process warms up again
            if t >= born[s[0]] + warmup_s:
                lives[s[0]].append((t, s[1]))
    growth = {pid: round((pts[-1][1] - pts[0][1]) / pts[0][1] * 100.0, 2)
              for pid, pts in lives.items() if pts[-1][0] - pts[0][0] >= min_span_s}
    return {"per_process_pct": growth, "max_pct": max(growth.values()) if growth else None}


def latency_drift(requests: Sequence[Request], duration_s: float, window_s: float) -> dict[str, Any]:
    """TTFT and end-to-end percentiles of the requests served in the first and the last ``window_s``."""
    ok = [r for r in requests if r.complete and r.ttft_s is not None]

    def stats(rs: list[Request]) -> dict[str, float | None]:
        if not rs:
            return {"n": 0, "ttft_p50_s": None, "ttft_p99_s": None, "e2e_p50_s": None, "e2e_p99_s": None}
        ttft = [r.ttft_s for r in rs if r.ttft_s is not None]
        e2e = [r.end_s - r.sent_s for r in rs]
        return {"n": len(rs), "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
                "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99)}

    first = stats([r for r in ok if r.sent_s < window_s])
    last = stats([r for r in ok if r.sent_s >= duration_s - window_s])
    drift = {k: round(last[k] / first[k] - 1.0, 4) for k in first  # type: ignore[operator]
             if k != "n" and first[k] and last[k] is not None}
    return {"window_s": window_s, "first": first, "last": last, "drift": drift,
            "within_10pct": all(v <= LATENCY_DRIFT_MAX for v in drift.values()) if drift else None}


def table(result: dict[str, Any]) -> str:
    """The run as a Markdown table: one row per fault window (availability by tier), then the audit."""
    tiers = ["open", "budgeted", "capped"]
    lines = ["| window | from-to (s) | " + " | ".join(f"{t} served/offered" for t in tiers) + " |",
             "|---|---|" + "---|" * len(tiers)]
    for name, w in result["availability_by_window"].items():
        span = f"{w['from_s']:.0f}-{w['to_s']:.0f}" if "from_s" in w else ""
        if w.get("overlapping"):
            name += " (overlapping)"
        cells = []
        for t in tiers:
            a = w["tiers"].get(t)
            cells.append("-" if not a else f"{a['served']}/{a['offered']} ({a['availability']:.1%})")
        lines.append(f"| {name} | {span} | " + " | ".join(cells) + " |")
    audit_keys = ("offered", "served", "lost", "duplicated", "misrecorded", "extra", "recorded_then_cut",
                  "unmetered_cut",
                  "ledger_vs_backends_max_diff_tokens", "overspend_usd", "holds_left", "rss_growth_pct")
    lines += ["", "| audit | value |", "|---|---|"]
    lines += [f"| {k} | {result.get(k)} |" for k in audit_keys]
    return "\n".join(lines)
