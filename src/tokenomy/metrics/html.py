"""Self-contained HTML reports: the tables a command prints and interactive plots, in one file
that opens offline (``--html FILE`` of ``tokenomy sim``, ``sim compare``, ``bench`` and ``plan``).

Plots are plotly.js figures; the library itself (plotly.js, MIT licence) comes from the ``plotly``
Python package (``plotly.offline.get_plotlyjs()``) and is inlined once per file, so the report
loads nothing from the network: no CDN, no ``src``/``href`` to anywhere. Tables are the rich
tables the command printed, turned into HTML tables. Figures are plain dicts
(``{"data": [...], "layout": {...}}``, plotly's JSON), built in :mod:`tokenomy.metrics.html_figures`.
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 72rem;
       color: #1d2330; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .25rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
p.sub { color: #5a6275; margin-top: 0; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; }
caption { text-align: left; font-weight: 600; padding-bottom: .25rem; }
th, td { border-bottom: 1px solid #dde1ea; padding: .25rem .6rem; }
th { background: #f3f5f9; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.fig { width: 100%; height: 26rem; }
"""


def _cell_text(cell: Any) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return Text.from_markup(cell).plain  # "[bold]x[/]" -> "x"
    return str(cell)


def table_rows(table: Table) -> tuple[list[str], list[list[str]]]:
    """A rich table's headers and rows as plain text."""
    headers = [_cell_text(c.header) for c in table.columns]
    columns = [[_cell_text(cell) for cell in c.cells] for c in table.columns]
    rows = [list(r) for r in zip(*columns, strict=True)] if columns else []
    return headers, rows


class HtmlReport:
    """Headings, paragraphs, tables and figures, in order; :meth:`write` makes the file."""

    def __init__(self, title: str, subtitle: str = "") -> None:
        self.title = title
        self.subtitle = subtitle
        self._parts: list[str] = []
        self._figures = 0

    def heading(self, text: str) -> None:
        self._parts.append(f"<h2>{html.escape(text)}</h2>")

    def paragraph(self, text: str) -> None:
        self._parts.append(f"<p>{html.escape(text)}</p>")

    def table(self, table: Table, caption: str | None = None) -> None:
        """A rich table (as the command printed it) as an HTML table; right-justified columns
        are numbers."""
        headers, rows = table_rows(table)
        numeric = [c.justify == "right" for c in table.columns]
        title = caption if caption is not None else (_cell_text(table.title) if table.title else "")
        out = ["<table>"]
        if title:
            out.append(f"<caption>{html.escape(title)}</caption>")
        out.append("<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr></thead><tbody>")
        for row in rows:
            out.append("<tr>" + "".join(
                f'<td class="num">{html.escape(v)}</td>' if numeric[i] else f"<td>{html.escape(v)}</td>"
                for i, v in enumerate(row)) + "</tr>")
        out.append("</tbody></table>")
        self._parts.append("".join(out))

    def figure(self, figure: dict[str, Any]) -> None:
        """A plotly figure (``data`` and ``layout``), drawn by the inlined plotly.js."""
        self._figures += 1
        div = f"fig{self._figures}"
        spec = json.dumps(figure, allow_nan=False).replace("</", "<\\/")  # never closes the script early
        self._parts.append(
            f'<div class="fig" id="{div}"></div>'
            f"<script>(function(){{var f={spec};"
            f'Plotly.newPlot("{div}",f.data,f.layout,{{responsive:true,displaylogo:false,showLink:false,showSendToCloud:false,showEditInChartStudio:false}});}})();</script>'
        )

    def render(self) -> str:
        from plotly.offline import get_plotlyjs

        script = get_plotlyjs() if self._figures else ""
        head = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
                f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>{html.escape(self.title)}</title><style>{_STYLE}</style>"
                f"<script>{script}</script></head><body>")
        sub = f'<p class="sub">{html.escape(self.subtitle)}</p>' if self.subtitle else ""
        return head + f"<h1>{html.escape(self.title)}</h1>{sub}" + "\n".join(self._parts) + "</body></html>\n"

    def write(self, path: str | Path) -> Path:
        """Write the file atomically (temp file in the same folder, then rename)."""
        target = Path(path)
        text = self.render()
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target


__all__ = ["HtmlReport", "table_rows"]
