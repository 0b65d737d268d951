"""The ledger's usage as people read it: token classes and dollars per tenant (a tree of names),
key, model, session or backend, as a table that fits a 120-column terminal.

Used by ``tokenomy usage`` and ``tokenomy demo``. The ledger keeps tenant paths as node ids
(``org_…/team_…/key_…``); :func:`node_names` reads the names the tenant tree gave them, from the
same database, without writing to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from rich import box
from rich.table import Table

from tokenomy.gateway.metering.ledger import UsageEvent
from tokenomy.gateway.metering.usage_api import group_usage, totals

COLUMNS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("input_tokens", "input"),
    ("incremental_prefill_tokens", "incr. prefill"),
    ("output_tokens", "output"),
    ("reasoning_tokens", "reasoning"),
    ("cached_tokens", "cached"),
    ("recomputed_tokens", "recomputed"),
    ("cost_usd", "cost $"),
    ("cache_savings_usd", "saved $"),
)
"""(total's field, column header), in table order. ``history_tokens`` (the re-sent conversation:
prompt - input - incremental prefill) stays in the JSON; the table keeps to what is billed apart."""


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One table row: ``label`` as shown (tree prefix and name), ``key`` the ledger's value
    (a tenant path of ids, a session id, ...), ``depth`` in the tenant tree (0 elsewhere)."""

    label: str
    key: str
    depth: int
    totals: dict[str, Any]


def node_names(url: str) -> dict[str, str]:
    """Node id -> name from the tenant table in the database at ``url`` ({} when it has none).

    Read-only: unlike opening a ``TenantStore``, it creates no table and bumps no version.
    """
    engine = sa.create_engine(url)
    try:
        if not sa.inspect(engine).has_table("tk_nodes"):
            return {}
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT id, name FROM tk_nodes")).all()
        return {str(r[0]): str(r[1]) for r in rows}
    finally:
        engine.dispose()


def tenant_tree(events: Sequence[UsageEvent], names: Mapping[str, str]) -> list[UsageRow]:
    """Totals per org, team and key, each level under its parent, largest cost first.

    Labels read as a tree (``├─``/``└─``) with each node's name (its id when unnamed, e.g. a
    deleted tenant or a ledger read without its tenant table).
    """
    by_path: dict[tuple[str, ...], list[UsageEvent]] = {}
    for e in events:
        parts = tuple(p for p in e.tenant_path.split("/") if p) or ("(none)",)
        for depth in range(1, len(parts) + 1):
            by_path.setdefault(parts[:depth], []).append(e)
    sums = {path: totals(evs) for path, evs in by_path.items()}

    def children(parent: tuple[str, ...]) -> list[tuple[str, ...]]:
        kids = [p for p in sums if len(p) == len(parent) + 1 and p[: len(parent)] == parent]
        return sorted(kids, key=lambda p: (-sums[p]["cost_usd"], p))

    rows: list[UsageRow] = []

    def walk(path: tuple[str, ...], prefix: str, last: bool) -> None:
        name = names.get(path[-1], path[-1])
        branch = "" if len(path) == 1 else ("└─ " if last else "├─ ")
        rows.append(UsageRow(prefix + branch + name, "/".join(path), len(path) - 1, sums[path]))
        kids = children(path)
        below = prefix + ("" if len(path) == 1 else ("   " if last else "│  "))
        for i, kid in enumerate(kids):
            walk(kid, below, i == len(kids) - 1)

    for org in children(()):
        walk(org, "", True)
    return rows


def grouped_rows(events: Sequence[UsageEvent], by: str, names: Mapping[str, str] | None = None,
                 limit: int | None = None) -> list[UsageRow]:
    """Rows of ``tokenomy usage --by BY``: the tenant tree for ``tenant``, else one row per value
    of ``by`` (largest cost first, at most ``limit``); keys are shown by name when known."""
    if by == "tenant":
        return tenant_tree(events, names or {})
    groups = list(group_usage(list(events), by).items())[:limit]
    label = (lambda k: (names or {}).get(k, k)) if by == "key" else (lambda k: k)
    return [UsageRow(label(k) or "(none)", k, 0, row) for k, row in groups]


def _cell(field: str, value: Any) -> str:
    if field.endswith("_usd"):
        return f"{value:.4f}" if value >= 0.01 else f"{value:.6f}"
    return f"{value:,}"


def usage_table(rows: Sequence[UsageRow], first: str, title: str | None = None) -> Table:
    """The rows as a rich table whose headers stay whole at 120 columns (numbers never wrap;
    long tenant or session names fold instead)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1))
    widest = max([len(row.label) for row in rows] + [len(first)])
    table.add_column(first, overflow="fold", min_width=min(widest, 16))
    # reasoning only when some backend reported it: a column of zeros would squeeze the names
    columns = [(f, h) for f, h in COLUMNS if f != "reasoning_tokens" or any(r.totals.get(f) for r in rows)]
    for _field, head in columns:
        table.add_column(head, justify="right", no_wrap=True, min_width=len(head))
    for row in rows:
        style = "bold" if row.depth == 0 and first == "tenant" else None
        table.add_row(row.label, *(_cell(f, row.totals.get(f, 0)) for f, _ in columns), style=style)
    return table


__all__ = ["COLUMNS", "UsageRow", "grouped_rows", "node_names", "tenant_tree", "usage_table"]
