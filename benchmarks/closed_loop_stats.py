"""The statistics of ``benchmarks/closed_loop.py``: one run's figures, cells pooled into one fleet,
the simulated figure as the mean of K jittered draws, and the Done-when checks.

Why (docs/closed-loop.md, "Comparing live with simulated"): a live run is one draw of a noisy
process (which turn meets a deadline, and so which session is abandoned, turns on milliseconds),
and so is one simulation. The simulated figure a live run is held to is therefore the mean over
``draws`` simulations of the same workload with session starts shifted by up to 10 ms (a
Monte-Carlo estimate of what the simulator predicts, with its spread), and the sample is larger:
``cells`` independent 2-instance cells, each its own gateway and workload seed, pooled.

``goodput_rps`` is SLO-met requests that finished within a fixed window ``[0, goodput_window_s]``
divided by it: one definition for sim and live, blind and closed. The earlier window, from 0 to
the latest last finish among the modes of a side, is kept as ``goodput_rps_last_finish``: the last
finish is one order statistic (the end of the longest surviving session), and it moved goodput
by 7% (one standard deviation) over the simulator's 20 draws of one cell, where the SLO-met count,
and so goodput over a fixed window, moved by 4-5%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tokenomy.core import SLO, RequestRecord
from tokenomy.metrics.summary import Summary

TOLERANCE = 0.08
"""The Done-when line: every live figure within 0.08 of its simulated one (goodput: relative)."""


def figures(summary: Summary, records: list[RequestRecord], slo: SLO, window_s: float) -> dict[str, Any]:
    """What the benchmark reports of one run (one cell, one mode). ``goodput_rps`` is SLO-met
    requests finished by ``window_s`` over ``window_s``; ``goodput_rps_last_finish`` is set later
    (:func:`common_goodput`), from ``end_s``, the run's last finish."""
    tiers = summary.by_tier
    pick = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
    in_window = [r for r in records if _met(r, slo) and r.finish_s is not None and r.finish_s <= window_s]
    return {
        "attainment_by_tier": {t: round(g["attainment"], 4) for t, g in tiers.items()},
        "goodput_rps": round(len(in_window) / window_s, 4),
        "goodput_window_s": window_s,
        "goodput_rps_last_finish": None,
        "slo_met_after_window": summary.slo_met - len(in_window),
        "end_s": round(last_finish(records), 2),
        "attainment": round(summary.slo_attainment, 4),
        "slo_met": summary.slo_met,
        "requests": summary.requests,
        "slo_met_by_tier": {t: g["slo_met"] for t, g in tiers.items()},
        "requests_by_tier": {t: g["requests"] for t, g in tiers.items()},
        "refused_by_tier": {t: g["refused"] for t, g in tiers.items()},
        "retried_by_tier": {t: g.get("retried", 0) for t, g in tiers.items()},
        "deferred_by_tier": {t: g["deferred"] for t, g in tiers.items()},
        "latency_by_tier": {t: {k: None if g[k] is None else round(g[k], 3) for k in pick} for t, g in tiers.items()},
        "ttft_s_by_tier": ttfts_by_tier(records),
    }


def _met(r: RequestRecord, slo: SLO) -> bool:
    """The SLO test of ``tokenomy.metrics.summarize``, for one record."""
    return r.finished and r.finish_s is not None and r.first_token_s is not None and slo.met(r.ttft_s or 0.0,
                                                                                                 r.tpot_s or 0.0)


def ttfts_by_tier(records: list[RequestRecord]) -> dict[str, list[float]]:
    """Every request's TTFT by tier (ms resolution, sorted): the live and simulated distributions."""
    out: dict[str, list[float]] = {}
    for r in records:
        if r.ttft_s is not None:
            out.setdefault(r.tier, []).append(round(r.ttft_s, 3))
    return {t: sorted(v) for t, v in sorted(out.items())}


def last_finish(records: list[RequestRecord]) -> float:
    return max((r.finish_s for r in records if r.finish_s is not None), default=0.0)


def _sum_by_tier(cells: Sequence[dict[str, Any]], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in cells:
        for t, v in (c.get(key) or {}).items():
            if v is not None:
                out[t] = out.get(t, 0) + int(v)
    return dict(sorted(out.items()))


def pool(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One fleet's figures from its cells' (each a :func:`figures` dict, same window): counts
    summed, attainment per tier as met over offered, goodput as the cells' rates summed (the
    earlier ``goodput_rps_last_finish`` too, once :func:`common_goodput` set it on every cell: each
    cell over its own modes' window), TTFT percentiles over every cell's TTFTs; each cell's own
    figures under ``cells``."""
    met, req = _sum_by_tier(cells, "slo_met_by_tier"), _sum_by_tier(cells, "requests_by_tier")
    ttfts: dict[str, list[float]] = {}
    for c in cells:
        for t, v in c["ttft_s_by_tier"].items():
            ttfts.setdefault(t, []).extend(v)
    slo_met, requests = sum(c["slo_met"] for c in cells), sum(c["requests"] for c in cells)
    return {
        "attainment_by_tier": {t: round(met.get(t, 0) / n, 4) for t, n in req.items() if n},
        "goodput_rps": round(sum(c["goodput_rps"] for c in cells), 4),
        "goodput_window_s": cells[0]["goodput_window_s"],
        "goodput_rps_last_finish": (None if any(c["goodput_rps_last_finish"] is None for c in cells)
                                    else round(sum(c["goodput_rps_last_finish"] for c in cells), 4)),
        "slo_met_after_window": sum(c["slo_met_after_window"] for c in cells),
        "end_s": max(c["end_s"] for c in cells),
        "attainment": round(slo_met / requests, 4) if requests else 0.0,
        "slo_met": slo_met,
        "requests": requests,
        "slo_met_by_tier": met,
        "requests_by_tier": req,
        **{k: _sum_by_tier(cells, k) for k in ("refused_by_tier", "retried_by_tier", "deferred_by_tier")},
        "ttft_p50_p99_by_tier": {t: [_pct(v, 50), _pct(v, 99)] for t, v in sorted(ttfts.items())},
        "ttft_s_by_tier": {t: sorted(v) for t, v in sorted(ttfts.items())},
        "cells": [{k: v for k, v in c.items() if k != "ttft_s_by_tier"} for c in cells],
    }


def _pct(v: list[float], q: float) -> float | None:
    if not v:
        return None
    s = sorted(v)
    return round(s[min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1)], 3)


def common_goodput(side: dict[str, dict[str, Any]], modes: Sequence[str]) -> None:
    """The earlier definition, kept: each mode's ``goodput_rps_last_finish`` is its SLO-met requests
    over ``[0, latest end_s of the side's modes]`` (a simulation-only mode over that window or up
    to its own last finish, if later). ``side``: one cell's modes."""
    window = max(f["end_s"] for m, f in side.items() if m in modes)
    for f in side.values():
        w = max(window, f["end_s"])
        f["goodput_rps_last_finish"] = round(f["slo_met"] / w, 4) if w > 0 else 0.0
        f["goodput_window_last_finish_s"] = round(w, 2)


def flat(f: dict[str, Any]) -> dict[str, float]:
    """The figures the live run is held to (and a few more), flat: ``attainment.<tier>``,
    ``goodput_rps``, ``goodput_rps_last_finish``, ``slo_met``, ``requests``, ``end_s`` (the last
    finish over the cells), ``slo_met_after_window``."""
    return {**{f"attainment.{t}": a for t, a in f["attainment_by_tier"].items()},
            **{k: f[k] for k in ("goodput_rps", "goodput_rps_last_finish", "slo_met", "requests", "end_s",
                                 "slo_met_after_window")}}


def draws_mean(rows: list[dict[str, float]]) -> dict[str, Any]:
    """The simulated figures of one mode as the mean of its draws, with each figure's spread
    (min, max, sample standard deviation) over them."""
    keys = sorted({k for r in rows for k in r})
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in keys}
    spread = {k: {"min": min(r[k] for r in rows), "max": max(r[k] for r in rows),
                  "sd": round(_sd([r[k] for r in rows]), 4)} for k in keys}
    tiers = sorted(k.split(".", 1)[1] for k in keys if k.startswith("attainment."))
    return {"attainment_by_tier": {t: round(mean[f"attainment.{t}"], 4) for t in tiers},
            "goodput_rps": round(mean["goodput_rps"], 4),
            "goodput_rps_last_finish": round(mean["goodput_rps_last_finish"], 4),
            "slo_met": round(mean["slo_met"], 1), "requests": round(mean["requests"], 1),
            "draws": len(rows), "spread": spread}


def _sd(v: list[float]) -> float:
    if len(v) < 2:
        return 0.0
    m = sum(v) / len(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def gaps(live: dict[str, Any], sim: dict[str, Any], modes: Sequence[str], goodput_key: str) -> dict[str, float | None]:
    """Each live figure minus its simulated one: attainment per tier absolute, goodput
    (``goodput_key``) relative."""
    out: dict[str, float | None] = {}
    for m in modes:
        s, lv = sim[m], live[m]
        for t, a in s["attainment_by_tier"].items():
            out[f"{m}.attainment.{t}"] = round(lv["attainment_by_tier"].get(t, 0.0) - a, 4)
        out[f"{m}.goodput_rel"] = round(lv[goodput_key] / s[goodput_key] - 1, 4) if s[goodput_key] else None
    return out


def within(g: dict[str, float | None]) -> bool:
    return all(v is not None and abs(v) <= TOLERANCE for v in g.values())


def side_checks(blind: dict[str, Any], closed: dict[str, Any]) -> dict[str, Any]:
    """The top tier's attainment and goodput over the blind run's, for one side."""
    gold = closed["attainment_by_tier"].get("gold", 0.0)
    ratio = closed["goodput_rps"] / blind["goodput_rps"] if blind["goodput_rps"] else None
    old = (closed["goodput_rps_last_finish"] / blind["goodput_rps_last_finish"]
           if blind.get("goodput_rps_last_finish") else None)
    return {"gold_attainment": gold, "gold_ok": gold >= 0.95, "goodput_ratio": ratio,
            "goodput_ok": ratio is not None and ratio >= 0.95, "goodput_ratio_last_finish": old,
            "lowest_tier_attainment": closed["attainment_by_tier"].get("free", 0.0)}


def per_draw_checks(draws: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """The closed loop's top tier and goodput ratio in each simulated draw."""
    golds = [r.get("attainment.gold", 0.0) for r in draws["closed"]]
    ratios = [c["goodput_rps"] / b["goodput_rps"] for b, c in zip(draws["blind"], draws["closed"], strict=True)
              if b["goodput_rps"]]
    return {"gold_min": min(golds), "gold_draws_below_0.95": sum(g < 0.95 for g in golds),
            "goodput_ratio_min": round(min(ratios), 4), "goodput_ratio_max": round(max(ratios), 4),
            "goodput_ratio_draws_below_0.95": sum(r < 0.95 for r in ratios), "draws": len(golds)}


def inside_spread(live: dict[str, Any], sim: dict[str, Any], modes: Sequence[str]) -> dict[str, bool]:
    """Whether each live figure lies within the simulated draws' [min, max]."""
    out = {}
    for m in modes:
        for k, v in flat(live[m]).items():
            sp = sim[m]["spread"].get(k)
            if sp is not None and (k.startswith("attainment.") or k.startswith("goodput_rps")):
                out[f"{m}.{k}"] = sp["min"] <= v <= sp["max"]
    return out
