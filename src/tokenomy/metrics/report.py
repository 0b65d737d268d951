"""Human and machine outputs of Summaries: a rich table, atomic JSON files, comparison plots."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tokenomy.core import SLO
from tokenomy.metrics.goodput import DEFAULT_ATTAINMENT_TARGET
from tokenomy.metrics.summary import Summary

_DASH = "-"
_NA = "n/a"  # not measurable with what was given (no GPU price, no FLOP peak), rather than zero


def _ms(v: float | None) -> str:
    return _DASH if v is None else f"{v * 1e3:.1f}"


def _pct(v: float | None) -> str:
    return _DASH if v is None else f"{v * 100:.1f}%"


def _num(v: float | None, fmt: str) -> str:
    return _DASH if v is None else format(v, fmt)


# (row label, cell text of one Summary). Token-class rows follow these.
_ROWS: list[tuple[str, Callable[[Summary], str]]] = [
    ("requests (finished)", lambda s: f"{s.requests:,} ({s.finished:,})"),
    ("rejected (cannot run)", lambda s: f"{s.rejected:,}"),
    ("busy window / span (s)", lambda s: f"{s.duration_s:,.1f} / {s.span_s:,.1f}"),
    ("TTFT P50 (ms)", lambda s: _ms(s.ttft_p50_s)),
    ("TTFT P99 (ms)", lambda s: _ms(s.ttft_p99_s)),
    ("TPOT P50 (ms)", lambda s: _ms(s.tpot_p50_s)),
    ("TPOT P99 (ms)", lambda s: _ms(s.tpot_p99_s)),
    ("ITL P99 (ms)", lambda s: _ms(s.itl_p99_s)),
    ("E2E P99 (ms)", lambda s: _ms(s.e2e_p99_s)),
    ("SLO attainment", lambda s: _pct(s.slo_attainment)),
    ("goodput (req/s)", lambda s: _num(s.goodput_rps, ".3f")),
    ("goodput per GPU (req/s)", lambda s: _num(s.goodput_per_gpu_rps, ".3f")),
    ("RPM", lambda s: _num(s.rpm, ",.1f")),
    ("TPM", lambda s: _num(s.tpm, ",.0f")),
    ("cost per M tokens ($)", lambda s: _NA if s.cost_per_mtok_usd is None else f"{s.cost_per_mtok_usd:.4f}"),
    ("cost per M output tokens ($)",
     lambda s: _NA if s.cost_per_mtok_output_usd is None else f"{s.cost_per_mtok_output_usd:.4f}"),
    ("MFU", lambda s: _NA if s.mfu is None else _pct(s.mfu)),
]


def render_table(
    summaries: Mapping[str, Summary], console: Console | None = None, title: str = "Tokenomy metrics"
) -> Table:
    """Print one column per deployment (rows: latency percentiles, attainment, goodput, cost, MFU,
    token classes) to ``console`` (a new stdout Console if None) and return the table."""
    table = Table(title=title)
    table.add_column("metric", style="bold")
    for name in summaries:
        table.add_column(name, justify="right")
    for label, cell in _ROWS:
        table.add_row(label, *[cell(s) for s in summaries.values()])
    classes = list(dict.fromkeys(k for s in summaries.values() for k in s.tokens))
    for cls in classes:
        table.add_row(f"tokens: {cls}", *[f"{s.tokens.get(cls, 0):,}" for s in summaries.values()])
    out = console or Console()
    out.print(table)
    if any(s.by_tier for s in summaries.values()):
        out.print(tier_table(summaries))
    reasons: dict[str, int] = {}
    for summary in summaries.values():
        for reason, n in summary.rejected_reasons.items():
            reasons[reason] = max(reasons.get(reason, 0), n)
    for reason, n in reasons.items():
        out.print(f"rejected: {n:,} request(s): {reason}; they count as SLO misses and add no tokens or time",
                  highlight=False)
    return table


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    return {"pct": f"{value:.1%}", "s": f"{value:.3f}", "rps": f"{value:.3f}", "n": f"{value:,}"}[kind]


_TIER_ROWS = (("attainment", "attainment", "pct"), ("goodput (req/s)", "goodput_rps", "rps"),
              ("TTFT P50 (s)", "ttft_p50_s", "s"), ("TTFT P99 (s)", "ttft_p99_s", "s"),
              ("TPOT P50 (s)", "tpot_p50_s", "s"), ("TPOT P99 (s)", "tpot_p99_s", "s"),
              ("requests", "requests", "n"), ("refused", "refused", "n"), ("deferred", "deferred", "n"),
              ("retried", "retried", "n"))


def tier_table(summaries: Mapping[str, Summary]) -> Table:
    """One column per (deployment, tier): attainment, goodput, TTFT/TPOT P50/P99, refusals, deferrals."""
    table = Table(title="per tier")
    table.add_column("metric", style="bold")
    cols = [(name, tier, s.by_tier[tier]) for name, s in summaries.items() for tier in s.by_tier]
    for name, tier, _ in cols:
        table.add_column(f"{name}: {tier or '(none)'}", justify="right")
    for label, key, kind in _TIER_ROWS:
        table.add_row(label, *[_fmt(g.get(key), kind) for _, _, g in cols])
    return table


def _to_jsonable(obj: Any) -> Any:
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(f"cannot write {type(obj).__name__} as JSON (give it a to_dict() or convert it)")


def finite_or_none(value: Any) -> Any:
    """``value`` with every NaN or infinity (nested in dicts and lists) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    return value


def write_json(path: str | Path, payload: Any) -> Path:
    """Write ``payload`` as indented JSON to ``path`` atomically (temp file in the same folder,
    then rename), creating parent folders. Objects with a ``to_dict()`` (e.g. Summary) are
    converted. Raises ValueError if the payload holds NaN or infinity (strict JSON; use None)."""
    target = Path(path)
    try:
        text = json.dumps(payload, indent=2, allow_nan=False, default=_to_jsonable)
    except ValueError as exc:
        raise ValueError(f"{target}: payload holds NaN or infinity; use None for undefined values") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        # mkstemp makes the file 0600; a result is for sharing: owner writes, everyone reads.
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _pyplot() -> Any:
    # Agg is chosen here, not at import, so importing metrics never changes a user's backend.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _log_ticks(ax: Any) -> None:
    """Log axis ticks at 1, 2, 5 x 10^k, written plainly (``200``, not ``2 x 10^2``)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _percent_axis(ax: Any, values: Sequence[float], target: float | None) -> None:
    """Zoomed attainment axis (see _attainment_limits) with no tick above 100%."""
    ax.set_ylim(*_attainment_limits(values, target))
    ax.set_yticks([t for t in ax.get_yticks() if t <= 100.0])
    ax.set_ylim(*_attainment_limits(values, target))


def _split_label(name: str, split: tuple[int, int] | None) -> str:
    return f"{name} ({split[0]}P:{split[1]}D)" if split and "@" not in name else name


def _attainment_limits(values: Sequence[float], target: float | None) -> tuple[float, float]:
    """A y-range (in %) that shows the differences: from a little under the lowest value (or the
    target) to 100, so 96.6% and 99.8% do not look alike on a 0-100 axis."""
    low = min([*values, *([target] if target is not None else [])]) * 100
    pad = max(0.5, (100 - low) * 0.15)
    return max(0.0, low - pad), 100.0 + pad / 3


def plot_comparison(
    summaries: Mapping[str, Summary],
    path: str | Path,
    *,
    title: str | None = None,
    slo: SLO | None = None,
    splits: Mapping[str, tuple[int, int] | None] | None = None,
) -> Path:
    """Save a PNG of three panels per deployment: TTFT P50/P99 (log scale, SLO line), TPOT
    P50/P99 (log scale, SLO line) and SLO attainment (an axis zoomed to the values). ``title``
    heads the figure (name workload, model, GPU and rate there); ``splits`` adds each
    disaggregated deployment's P:D to the legend."""
    if not summaries:
        raise ValueError("plot_comparison needs at least one summary")
    plt = _pyplot()
    names = list(summaries)
    labels = [_split_label(n, (splits or {}).get(n)) for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.8))
    panels = [(axes[0], "TTFT", ("ttft_p50_s", "ttft_p99_s"), slo.ttft_s if slo else None),
              (axes[1], "TPOT", ("tpot_p50_s", "tpot_p99_s"), slo.tpot_s if slo else None)]
    width = 0.8 / len(names)
    for ax, what, attrs, bound in panels:
        for i, label in enumerate(labels):
            values = [(getattr(summaries[names[i]], a) or float("nan")) * 1e3 for a in attrs]
            ax.bar([m + i * width for m in range(len(attrs))], values, width, label=label)
        ax.set_xticks([m + width * (len(names) - 1) / 2 for m in range(len(attrs))], ["P50", "P99"])
        ax.set_yscale("log")
        _log_ticks(ax)
        ax.set_ylabel(f"{what} (ms, log scale)")
        ax.set_title(what)
        if bound is not None:
            ax.axhline(bound * 1e3, linestyle="--", color="crimson", label=f"SLO {bound * 1e3:g} ms")
        ax.legend(fontsize=8)
    att = [summaries[n].slo_attainment for n in names]
    bars = axes[2].bar(range(len(names)), [a * 100 for a in att], color=[f"C{i}" for i in range(len(names))])
    axes[2].set_xticks(range(len(names)), labels, rotation=15, fontsize=8)
    _percent_axis(axes[2], att, None)
    axes[2].bar_label(bars, [f"{a:.1%}" for a in att], fontsize=8)
    axes[2].set_ylabel("SLO attainment (%)")
    axes[2].set_title("requests meeting both SLOs")
    if title:
        fig.suptitle(title)
    return save_figure(plt, fig, path)


def plot_sweep(
    rates: Sequence[float],
    series: Mapping[str, Sequence[float]],
    path: str | Path,
    ylabel: str = "SLO attainment",
    xlabel: str = "request rate (req/s)",
    target: float | None = DEFAULT_ATTAINMENT_TARGET,
    title: str | None = None,
) -> Path:
    """Save a PNG of one line per deployment of ``series[name][i]`` against ``rates[i]``, with a
    dashed horizontal line at ``target`` (None for none) and ``title`` above. Attainment series
    (fractions) are drawn in percent on an axis zoomed to the values."""
    if not series:
        raise ValueError("plot_sweep needs at least one series")
    for name, ys in series.items():
        if len(ys) != len(rates):
            raise ValueError(f"series {name!r} has {len(ys)} points but there are {len(rates)} rates")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    # Distinct markers and dashes, so deployments that coincide (all at 100%) stay visible.
    for i, (name, ys) in enumerate(series.items()):
        ax.plot(list(rates), [y * 100 for y in ys], marker="osD^v<>"[i % 7], linestyle=["-", "--", ":", "-."][i % 4],
                markersize=8 - i % 4, label=name)
    if target is not None:
        ax.axhline(target * 100, linestyle="--", color="grey", label=f"target {target:.0%}")
    _percent_axis(ax, [y for ys in series.values() for y in ys], target)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{ylabel} (%)")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(plt, fig, path)


def save_figure(plt: Any, fig: Any, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (parent folders made), always closing it; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.tight_layout()
        fig.savefig(target, dpi=100)
    finally:
        plt.close(fig)
    return target
