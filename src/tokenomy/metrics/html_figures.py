"""The plots of the HTML reports, as plotly figure dicts: latency percentiles, token classes,
attainment vs rate, per-session cost. Pure functions of Summaries and records (no plotly import)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenomy.core import RequestRecord
from tokenomy.metrics.summary import Summary

Figure = dict[str, Any]

_PCTS = (("P50", "p50"), ("P90", "p90"), ("P99", "p99"))
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
"""plotly's default colour cycle, given explicitly so one deployment keeps its colour on every axis."""


def _layout(title: str, **more: Any) -> dict[str, Any]:
    return {"title": {"text": title}, "margin": {"t": 50, "r": 20, "b": 50, "l": 70},
            "legend": {"orientation": "h", "y": -0.18}, **more}


def latency_figure(summaries: Mapping[str, Summary]) -> Figure:
    """TTFT and TPOT P50/P90/P99 (ms) per deployment, grouped bars on two axes."""
    data = []
    for i, (name, s) in enumerate(summaries.items()):
        for metric, axis in (("ttft", "y"), ("tpot", "y2")):
            x = [f"{metric.upper()} {label}" for label, _ in _PCTS]
            y = [None if (v := getattr(s, f"{metric}_{key}_s")) is None else round(v * 1e3, 3) for _, key in _PCTS]
            data.append({"type": "bar", "name": name, "legendgroup": name, "showlegend": axis == "y",
                         "marker": {"color": COLORS[i % len(COLORS)]},
                         "x": x, "y": y, "xaxis": "x" if axis == "y" else "x2", "yaxis": axis,
                         "hovertemplate": "%{x}: %{y:.1f} ms<extra>" + name + "</extra>"})
    layout = _layout("Latency percentiles", barmode="group",
                     xaxis={"domain": [0, 0.47]}, xaxis2={"domain": [0.53, 1], "anchor": "y2"},
                     yaxis={"title": {"text": "TTFT (ms)"}}, yaxis2={"title": {"text": "TPOT (ms)"}, "anchor": "x2"})
    return {"data": data, "layout": layout}


ORIGIN_CLASSES = ("input_tokens", "incremental_prefill_tokens", "history_tokens", "output_tokens")
CACHE_CLASSES = ("cache_hit_tokens", "recomputed_tokens")


def token_classes_figure(summaries: Mapping[str, Summary]) -> Figure:
    """Per deployment, tokens by origin (input, incremental prefill, history, output) and the
    prompt split by the cache (hit vs recomputed), as two stacked bars."""
    names = list(summaries)
    data = []
    for cls in ORIGIN_CLASSES + CACHE_CLASSES:
        group = "by origin" if cls in ORIGIN_CLASSES else "prompt by cache"
        data.append({"type": "bar", "name": cls.removesuffix("_tokens").replace("_", " "),
                     "x": [[group] * len(names), names], "y": [s.tokens.get(cls, 0) for s in summaries.values()],
                     "hovertemplate": "%{y:,} tokens<extra>%{fullData.name}</extra>"})
    return {"data": data, "layout": _layout("Token classes", barmode="stack", yaxis={"title": {"text": "tokens"}})}


def attainment_figure(rates: Sequence[float], series: Mapping[str, Sequence[float]], target: float) -> Figure:
    """SLO attainment vs session rate, one line per deployment, with the attainment target."""
    data: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines+markers", "name": name, "x": list(rates),
         "y": [round(v, 6) for v in values], "hovertemplate": "%{x:g}/s: %{y:.1%}<extra>" + name + "</extra>"}
        for name, values in series.items()
    ]
    data.append({"type": "scatter", "mode": "lines", "name": f"target {target:.0%}", "x": [min(rates), max(rates)],
                 "y": [target, target], "line": {"dash": "dash", "color": "#888"}, "hoverinfo": "skip"})
    return {"data": data, "layout": _layout("SLO attainment vs session rate",
                                            xaxis={"title": {"text": "session rate (1/s)"}},
                                            yaxis={"title": {"text": "attainment"}, "tickformat": ".0%",
                                                   "range": [0, 1.05]})}


def p99_vs_rate_figure(rates: Sequence[float], ttft_s: Mapping[str, Sequence[float | None]]) -> Figure:
    """P99 TTFT (ms) vs session rate, one line per deployment."""
    data = [{"type": "scatter", "mode": "lines+markers", "name": name, "x": list(rates),
             "y": [None if v is None else round(v * 1e3, 3) for v in values]} for name, values in ttft_s.items()]
    return {"data": data, "layout": _layout("P99 TTFT vs session rate", xaxis={"title": {"text": "session rate (1/s)"}},
                                            yaxis={"title": {"text": "P99 TTFT (ms)"}, "type": "log"})}


@dataclass(frozen=True)
class TokenPrices:
    """USD per million tokens: recomputed prompt tokens, cached prompt tokens, output tokens."""

    input_per_mtok: float
    cached_input_per_mtok: float
    output_per_mtok: float


def session_costs(records: Sequence[RequestRecord], prices: TokenPrices) -> dict[str, dict[str, float]]:
    """Per session: dollars for recomputed input, cached input and output, by the records' usage."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        u = r.usage
        row = out.setdefault(r.session_id or r.request_id, {"recomputed": 0.0, "cached": 0.0, "output": 0.0})
        row["recomputed"] += u.recomputed_tokens * prices.input_per_mtok / 1e6
        row["cached"] += u.cache_hit_tokens * prices.cached_input_per_mtok / 1e6
        row["output"] += u.output_tokens * prices.output_per_mtok / 1e6
    return dict(sorted(out.items(), key=lambda kv: -sum(kv[1].values())))


def session_cost_figure(costs: Mapping[str, Mapping[str, float]], top: int = 40) -> Figure:
    """The ``top`` most expensive sessions' cost, stacked by class."""
    ids = list(costs)[:top]
    data = [{"type": "bar", "name": f"{cls} $", "x": ids, "y": [round(costs[i][cls], 9) for i in ids],
             "hovertemplate": "%{x}: $%{y:.6f}<extra>%{fullData.name}</extra>"}
            for cls in ("recomputed", "cached", "output")]
    return {"data": data, "layout": _layout(f"Cost per session (the {len(ids)} largest)", barmode="stack",
                                            yaxis={"title": {"text": "USD"}}, xaxis={"type": "category"})}


def bar_figure(title: str, labels: Sequence[str], series: Mapping[str, Sequence[float | None]], ytitle: str,
               line: float | None = None, percent: bool = False) -> Figure:
    """Grouped bars: one group per label, one bar per series; an optional horizontal reference
    line (e.g. 1.0 = the SLO)."""
    data: list[dict[str, Any]] = [{"type": "bar", "x": list(labels), "y": list(values), "name": name}
                                  for name, values in series.items()]
    yaxis: dict[str, Any] = {"title": {"text": ytitle}}
    if percent:
        yaxis.update(tickformat=".0%", range=[0, 1])
    layout = _layout(title, yaxis=yaxis, barmode="group", showlegend=len(series) > 1)
    if line is not None:
        layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": line, "y1": line,
                             "line": {"dash": "dash", "color": "#c0392b"}}]
    return {"data": data, "layout": layout}


__all__ = ["TokenPrices", "attainment_figure", "bar_figure", "latency_figure", "p99_vs_rate_figure",
           "session_cost_figure", "session_costs", "token_classes_figure"]
