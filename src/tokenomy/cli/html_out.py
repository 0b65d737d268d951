"""``--html FILE`` of ``tokenomy sim``, ``sim compare``, ``bench`` and ``plan``: the command's table
and its plots in one self-contained file (:mod:`tokenomy.metrics.html`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.table import Table

from tokenomy.core import SLO, RequestRecord
from tokenomy.metrics import Summary
from tokenomy.metrics.html import HtmlReport
from tokenomy.metrics.html_figures import (
    TokenPrices,
    attainment_figure,
    bar_figure,
    latency_figure,
    p99_vs_rate_figure,
    session_cost_figure,
    session_costs,
    token_classes_figure,
)


def _slo_line(slo: SLO) -> str:
    return f"SLO: TTFT <= {slo.ttft_s:g} s, TPOT <= {slo.tpot_s * 1e3:g} ms"


def write_sim_html(path: Path, title: str, table: Table, summaries: Mapping[str, Summary], slo: SLO) -> Path:
    rep = HtmlReport(f"tokenomy sim — {title}", _slo_line(slo))
    rep.table(table, caption="Metrics per deployment")
    rep.figure(latency_figure(summaries))
    rep.figure(token_classes_figure(summaries))
    return rep.write(path)


def write_compare_html(path: Path, title: str, table: Table, rates: Sequence[float],
                       curves: Mapping[str, Sequence[Summary]], target: float, slo: SLO) -> Path:
    """``curves``: per deployment label, its Summary at each rate."""
    rep = HtmlReport(f"tokenomy sim compare — {title}", _slo_line(slo))
    rep.table(table)
    rep.figure(attainment_figure(rates, {n: [s.slo_attainment for s in ss] for n, ss in curves.items()}, target))
    rep.figure(p99_vs_rate_figure(rates, {n: [s.ttft_p99_s for s in ss] for n, ss in curves.items()}))
    return rep.write(path)


def write_bench_html(path: Path, title: str, table: Table, name: str, summary: Summary,
                     records: Sequence[RequestRecord], slo: SLO, prices: TokenPrices) -> Path:
    rep = HtmlReport(f"tokenomy bench — {title}", _slo_line(slo))
    rep.table(table, caption="Metrics")
    rep.figure(latency_figure({name: summary}))
    rep.figure(token_classes_figure({name: summary}))
    costs = session_costs(records, prices)
    rep.paragraph(f"Per-session cost at list prices of ${prices.input_per_mtok:g} (recomputed input), "
                  f"${prices.cached_input_per_mtok:g} (cached input) and ${prices.output_per_mtok:g} (output) "
                  f"per million tokens: the gateway's default prices, a labelled default.")
    rep.figure(session_cost_figure(costs))
    top = Table(title="The 20 most expensive sessions (USD)")
    for col in ("session", "recomputed $", "cached $", "output $", "total $"):
        top.add_column(col, justify="left" if col == "session" else "right")
    for sid, c in list(costs.items())[:20]:
        top.add_row(sid, *(f"{v:.6f}" for v in (c["recomputed"], c["cached"], c["output"], sum(c.values()))))
    rep.table(top)
    return rep.write(path)


def write_plan_html(path: Path, title: str, table: Table, lines: Sequence[str],
                    bars: Mapping[str, tuple[float | None, float | None, float]]) -> Path:
    """``bars``: per chosen instance kind, (TTFT P95 / SLO, TPOT P95 / SLO, utilisation)."""
    rep = HtmlReport(f"tokenomy plan — {title}")
    for line in lines:
        rep.paragraph(line)
    rep.table(table)
    labels = list(bars)
    rep.figure(bar_figure("Predicted P95 as a multiple of its SLO (under 1: met)", labels,
                          {"TTFT P95 / SLO": [bars[lb][0] for lb in labels],
                           "TPOT P95 / SLO": [bars[lb][1] for lb in labels]}, "P95 / SLO", line=1.0))
    rep.figure(bar_figure("Predicted utilisation", labels, {"utilisation": [bars[lb][2] for lb in labels]},
                          "utilisation", percent=True))
    return rep.write(path)


__all__ = ["write_bench_html", "write_compare_html", "write_plan_html", "write_sim_html"]
