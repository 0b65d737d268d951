"""Budgets per tenant node and period: worst-case reservation before dispatch, actual cost after.

A request is charged to every node on its path (org, team, key), each in the node's own period
(``day``: ``2026-12-01``, ``month``: ``2026-12``, UTC). Before dispatch the guard state holds the
worst case — prompt estimate at the input price + ``max_tokens`` at the output price — against
all of them at once (``stores.guard_state.GuardState.admit``); a node without a budget is charged
too (its spend is reported) but never refuses. Settling replaces the hold by the actual cost,
releasing drops it. Spend never exceeds a budget as long as the actual cost of each request is
at most its worst case (the request path's prompt estimate must not undercount).

Alerts: ``settle`` reports each configured fraction (50/80/100%) a node's *settled* spend crossed
with this request (``crossings``; spend only grows within a period, so each fraction once and in
increasing order). Money held by requests in flight is a worst case, not spend: it never fires a
threshold. A refusal is its own event (``refusals``, once per node and period) with what refused
it: spent + held + this request's worst case over the budget.
"""

from __future__ import annotations

import calendar
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.tenancy import Node
from tokenomy.gateway.stores.reservations import Charge, Hold, Refusal


class PriceLike(Protocol):
    """USD per million tokens (the gateway config's ``Price``)."""

    @property
    def input_per_mtok(self) -> float: ...

    @property
    def output_per_mtok(self) -> float: ...


def worst_case_cost_usd(price: PriceLike, prompt_tokens: int, max_tokens: int) -> float:
    """Every prompt token recomputed and every allowed output token generated."""
    return (prompt_tokens * price.input_per_mtok + max_tokens * price.output_per_mtok) / 1e6


def remaining_fraction(path: Sequence[Node], usage: Sequence[tuple[float, float]]) -> float:
    """The smallest share of a period budget left along ``path``, given each node's (spent, held)
    this period (1.0: no budget applies)."""
    frac = 1.0
    for node, (spent, reserved) in zip(path, usage, strict=True):
        budget = node.limits.budget_usd
        if budget is None:
            continue
        if budget <= 0:
            return 0.0
        frac = min(frac, max(0.0, 1.0 - (spent + reserved) / budget))
    return frac


def output_cap(left_usd: float | None, price: PriceLike, prompt_tokens: int) -> int | None:
    """Output tokens a session budget with ``left_usd`` still pays for after the prompt (None: no
    session budget; below 1: the session's breaker trips)."""
    per_token = price.output_per_mtok / 1e6
    if left_usd is None or per_token <= 0:
        return None
    return math.floor((left_usd - prompt_tokens * price.input_per_mtok / 1e6) / per_token)


def period_key(period: str, now_s: float) -> str:
    """``2026-12-01`` (day) or ``2026-12`` (month) of ``now_s``, UTC."""
    t = time.gmtime(now_s)
    return f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}" if period == "day" else f"{t.tm_year:04d}-{t.tm_mon:02d}"


def seconds_to_period_end(period: str, now_s: float) -> float:
    if period == "day":
        return 86400.0 - (now_s % 86400.0)
    t = time.gmtime(now_s)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0)) - now_s


def node_label(node: Node) -> str:
    """``org acme (org_1f…)``: how refusals and alerts name a node (its name for people, its id for
    the admin API)."""
    return f"{node.kind.value} {node.name} ({node.id})"


@dataclass(frozen=True, slots=True)
class Crossing:
    """A node's settled spend passed ``threshold`` of its budget (``period``: the period key)."""

    node_id: str
    period: str
    threshold: float
    spent_usd: float
    budget_usd: float
    label: str = ""  # node_label(node)
    budget_period: str = ""  # day / month

    def alert(self) -> tuple[str, dict[str, Any]]:
        """The ``budget_threshold`` alert's message and data."""
        return (f"{self.label or self.node_id} spent {self.threshold:.0%} of its {self.budget_period or self.period} "
                f"budget (${self.spent_usd:.4f} of ${self.budget_usd:.4f})",
                {"threshold": self.threshold, "period": self.period, "spent_usd": self.spent_usd,
                 "budget_usd": self.budget_usd})


@dataclass(frozen=True, slots=True)
class RefusalEvent:
    """A node's budget refused a request: ``spent + held + request`` would pass ``budget``."""

    node_id: str
    label: str
    period: str
    budget_period: str
    spent_usd: float
    held_usd: float
    budget_usd: float
    request_usd: float

    def alert(self) -> tuple[str, dict[str, Any]]:
        """The ``budget_refusal`` alert's message and data."""
        return (f"{self.label} refused a request: spent ${self.spent_usd:.4f} + held ${self.held_usd:.4f} of "
                f"${self.budget_usd:.4f} this {self.budget_period}; the request may cost up to ${self.request_usd:.4f}",
                {"period": self.period, "spent_usd": self.spent_usd, "held_usd": self.held_usd,
                 "budget_usd": self.budget_usd, "request_usd": self.request_usd})


def crossed(thresholds: Sequence[float], spent_usd: float, actual_usd: float, budget_usd: float) -> list[float]:
    """The thresholds (ascending) that a settle of ``actual_usd`` bringing spend to ``spent_usd`` crossed."""
    before, after = (spent_usd - actual_usd) / budget_usd, spent_usd / budget_usd
    return [t for t in sorted(thresholds) if before + 1e-9 < t <= after + 1e-9]


def refusal_error(node: Node, refusal: Refusal, amount_usd: float, now_s: float) -> GatewayError:
    """The client's 429 ``budget_exceeded``. A request that would fit once the requests in flight
    finish may fit again in a moment (``retry-after: 1``); one that spend alone shuts out waits for
    the next period (``retry-after`` to its start, ``x-should-retry: false``)."""
    left = max(0.0, refusal.budget_usd - refusal.spent_usd - refusal.reserved_usd)
    period = node.limits.budget_period
    if refusal.reserved_usd > 0 and refusal.spent_usd + amount_usd <= refusal.budget_usd:
        why, headers = f" (${refusal.reserved_usd:.6f} is held by requests in flight)", {"retry-after": "1"}
    else:
        wait = max(1, math.ceil(seconds_to_period_end(period, now_s)))
        why, headers = "", {"retry-after": str(wait), "x-should-retry": "false"}
    return GatewayError(
        429, f"budget exceeded for {node_label(node)}: this request may cost up to "
        f"${amount_usd:.6f}, ${left:.6f} of ${refusal.budget_usd:.6f} is left this {period}{why}",
        type="insufficient_quota", code="budget_exceeded", headers=headers)


class BudgetPolicy:
    """What budgets mean: the charges of a path, the refusal a client reads, the threshold alerts
    and the priority tiers. The holds themselves are the guard state's (``stores.guard_state``),
    which checks and charges them atomically."""

    def __init__(self, thresholds: Sequence[float] = (0.5, 0.8, 1.0)) -> None:
        self.thresholds = tuple(sorted(thresholds))
        self._exhausted: set[Charge] = set()
        self.crossings: list[Crossing] = []  # drained by the owner (alerts)
        self.refusals: list[RefusalEvent] = []  # likewise
        self._day = -1
        self._periods: dict[str, str] = {}
        # per path (by identity: the tenant tree hands out one tuple per key until it changes),
        # its charges and budgets for the current day
        self._by_path: dict[int, tuple[Sequence[Node], tuple[Charge, ...], dict[Charge, float]]] = {}

    def plan(self, path: Sequence[Node], now_s: float) -> tuple[tuple[Charge, ...], dict[Charge, float]]:
        """The (node, period) charges of ``path`` at ``now_s`` and the budget of each budgeted one."""
        day = int(now_s // 86400)
        if day != self._day:  # period keys change only at UTC midnight
            self._day = day
            self._periods = {p: period_key(p, now_s) for p in ("day", "month")}
            self._by_path.clear()
        hit = self._by_path.get(id(path))
        if hit is not None and hit[0] is path:
            return hit[1], hit[2]
        charges = tuple((n.id, self._periods[n.limits.budget_period]) for n in path)
        budgets = {c: n.limits.budget_usd for c, n in zip(charges, path, strict=True) if n.limits.budget_usd is not None}
        if isinstance(path, tuple):  # immutable: safe to remember (the tree's tuples are)
            if len(self._by_path) >= 100_000:
                self._by_path.clear()
            self._by_path[id(path)] = (path, charges, budgets)  # holding ``path`` keeps its id unique
        return charges, budgets

    def refused(self, path: Sequence[Node], refusal: Refusal, amount_usd: float, now_s: float) -> GatewayError:
        """The 429 ``budget_exceeded`` of ``refusal``; the first per node and period becomes an alert."""
        node = next(n for n in path if n.id == refusal.charge[0])
        if refusal.charge not in self._exhausted:
            self._exhausted.add(refusal.charge)
            self.refusals.append(RefusalEvent(node.id, node_label(node), refusal.charge[1], node.limits.budget_period,
                                              refusal.spent_usd, refusal.reserved_usd, refusal.budget_usd, amount_usd))
        return refusal_error(node, refusal, amount_usd, now_s)

    def settled(self, hold: Hold, spent_after: Mapping[Charge, float], actual_usd: float,
                nodes: Sequence[Node]) -> None:
        """Thresholds that charging ``actual_usd`` for ``hold`` crossed go to ``crossings``
        (``spent_after``: each charge's spend right after; ``nodes``: the hold's path)."""
        for charge, node in zip(hold.charges, nodes, strict=False):
            budget = node.limits.budget_usd
            spent = spent_after.get(charge)
            if budget is None or budget <= 0 or charge[0] != node.id or spent is None:
                continue
            for t in crossed(self.thresholds, spent, actual_usd, budget):
                self.crossings.append(Crossing(node.id, charge[1], t, spent, budget, node_label(node),
                                               node.limits.budget_period))

    @staticmethod
    def tier_priority(path: Sequence[Node], spent_usd: Sequence[float]) -> int | None:
        """The lowest priority a budget tier imposes along the path, or None (``spent_usd``: each
        node's settled spend this period)."""
        out: int | None = None
        for node, spent in zip(path, spent_usd, strict=True):
            budget = node.limits.budget_usd
            if budget is None or not node.limits.budget_tiers:
                continue
            used = 1.0 if budget <= 0 else spent / budget
            for tier in node.limits.budget_tiers:
                if used + 1e-9 >= tier.at_fraction:
                    out = tier.priority if out is None else min(out, tier.priority)
        return out
