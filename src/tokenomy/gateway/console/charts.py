"""Inline SVG charts for the console: stacked bars over time buckets. No JavaScript, no assets.

Each chart is a ``<figure>`` with an SVG (one ``<rect>`` per non-zero segment, a ``<title>`` on
each for hover text) and a legend; the numbers behind it are also shown as a table on the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from markupsafe import Markup

# Okabe-Ito: distinguishable with the common colour-vision deficiencies
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM = 720, 220, 64, 22


def _fmt(value: float, unit: str) -> str:
    if unit == "$":
        return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"
    return f"{value:,.0f}{unit}" if value >= 10 or value == int(value) else f"{value:.1f}{unit}"


def stacked_bars(title: str, labels: Sequence[str], series: Mapping[str, Sequence[float]], unit: str = "") -> Markup:
    """``series`` name -> one value per label (bucket); bars stack in ``series`` order."""
    n = max(1, len(labels))
    totals = [sum(s[i] for s in series.values()) for i in range(len(labels))]
    top = max(totals, default=0.0) or 1.0
    plot_w, plot_h = WIDTH - PAD_LEFT - 8, HEIGHT - PAD_BOTTOM - 8
    slot = plot_w / n
    bar_w = max(1.0, slot * 0.8)
    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" class="chart">']
    for frac in (0.0, 0.5, 1.0):
        y = 8 + plot_h * (1 - frac)
        parts.append(f'<line x1="{PAD_LEFT}" x2="{WIDTH - 8}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{PAD_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(top * frac, unit))}</text>')
    for i, label in enumerate(labels):
        x = PAD_LEFT + i * slot + (slot - bar_w) / 2
        y = 8 + plot_h
        for k, (name, values) in enumerate(series.items()):
            v = values[i]
            if v <= 0:
                continue
            h = plot_h * v / top
            y -= h
            tip = escape(f"{label} {name}: {_fmt(v, unit)}")
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{PALETTE[k % len(PALETTE)]}"><title>{tip}</title></rect>')
        if i % max(1, n // 6) == 0:
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle">{escape(label)}</text>')
    parts.append("</svg>")
    legend = "".join(f'<span class="key"><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" '
                     f'fill="{PALETTE[k % len(PALETTE)]}"/></svg> {escape(name)}</span>' for k, name in enumerate(series))
    return Markup(f'<figure><figcaption>{escape(title)}</figcaption>{"".join(parts)}'
                  f'<div class="legend">{legend}</div></figure>')
