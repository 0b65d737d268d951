"""Reading an HTML report back as a browser would parse it: tags, links, table cells, figures."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

_VOID = {"meta", "br", "img", "link", "input", "hr", "col", "source"}


@dataclass
class Parsed:
    links: list[str] = field(default_factory=list)  # every src= and href= value
    cells: list[str] = field(default_factory=list)  # text of every <td> and <th>
    scripts: list[str] = field(default_factory=list)
    figures: list[dict[str, Any]] = field(default_factory=list)
    unclosed: list[str] = field(default_factory=list)

    def figure(self, title_part: str) -> dict[str, Any]:
        return next(f for f in self.figures if title_part in f["layout"]["title"]["text"])


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out = Parsed()
        self.stack: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.out.links += [v or "" for k, v in attrs if k in ("src", "href")]
        if tag not in _VOID:
            self.stack.append(tag)
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.out.cells.append("".join(self._cell).strip())
            self._cell = None
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()
        else:
            self.out.unclosed.append(tag)

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self.stack and self.stack[-1] == "script":
            self.out.scripts.append(data)


def read_report(path: Path) -> Parsed:
    """Parse the file; every figure's JSON (``var f={...};``) is decoded."""
    reader = _Reader()
    reader.feed(path.read_text(encoding="utf-8"))
    reader.close()
    out = reader.out
    out.unclosed += reader.stack
    for script in out.scripts:
        m = re.match(r"\(function\(\)\{var f=(.*);Plotly\.newPlot\(", script, re.S)
        if m:
            out.figures.append(json.loads(m.group(1).replace("<\\/", "</")))
    return out


def assert_self_contained(parsed: Parsed) -> None:
    """Opens offline: no src/href to the network, plotly.js inlined, balanced tags."""
    assert [u for u in parsed.links if re.match(r"\s*(https?:)?//", u)] == []
    assert any("Plotly" in s and len(s) > 1_000_000 for s in parsed.scripts), "plotly.js is not inlined"
    assert parsed.unclosed == []
