"""The planner's mixed-integer program, solved by HiGHS through ``scipy.optimize.milp``.

Variables: one binary ``x_o`` per option ``o`` = (instance shape, count), so that the integer
count of a shape is ``n_c = sum_k k x_(c,k)`` and its predicted P95 is read off exactly at that
count; a binary ``m`` (1: disaggregated, 0: colocated); the epigraph variable ``z``.

Constraints::

    sum_{o in prefill} x_o = m,   sum_{o in decode} x_o = m,   sum_{o in mixed} x_o = 1 - m
    sum_o gpus_o x_o <= inventory_g                  for every GPU type g (only its options)
    sum_{o in role r} score_o x_o <= z               for r in prefill, decode, mixed
    sum_o log(attainment_o) x_o >= log(target)       (with a target: the plan's SLO attainment)

A plan's predicted attainment is the product of its roles' (prefill TTFT times decode TPOT, or a
mixed pool's own), so its logarithm is linear in ``x``; options below the target on their own
are dropped before the solve. Objectives: ``p95`` minimises ``z`` (the worst role's P95 over its
SLO bound) among the plans that attain the target, with the other roles' scores as a tie-break
(spare GPUs lower the non-bottleneck role's P95); ``cost`` minimises $/hour among them, with
``z`` as the tie-break. ``exclude`` adds no-good cuts (to find the runner-up) and ``mode`` pins ``m``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from tokenomy.plan.options import Option

OBJECTIVES = ("p95", "cost")
_TIE = 1e-4


@dataclass(frozen=True)
class Solution:
    """The options chosen (one per role in use), the objective's ``z`` and the solve time."""

    chosen: tuple[Option, ...]
    z: float
    solve_s: float

    @property
    def disaggregated(self) -> bool:
        return any(o.candidate.role != "mixed" for o in self.chosen)

    @property
    def usd_per_hour(self) -> float:
        return sum(o.usd_per_hour for o in self.chosen)

    @property
    def attainment(self) -> float:
        """Predicted SLO attainment of the plan: the product of its roles'."""
        return math.prod(o.attainment for o in self.chosen)


def solve(
    options: Sequence[Option],
    inventory: dict[str, int],
    objective: str = "p95",
    *,
    exclude: Sequence[tuple[Option, ...]] = (),
    mode: str | None = None,
    target: float = 0.0,
) -> Solution | None:
    """The best choice of options whose predicted attainment is at least ``target`` (0: any), or
    None when no choice satisfies the constraints.

    ``mode`` is None (either), ``"disagg"`` or ``"mixed"``. Raises ``ValueError`` for an
    unknown objective.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"target must lie in [0, 1], got {target}")
    if objective == "cost" and target <= 0:
        raise ValueError("the cost objective needs an attainment target > 0 (the cheapest plan that attains it)")
    t0 = time.perf_counter()
    opts = [o for o in options if o.attainment >= target and o.attainment > 0.0] if target > 0 else list(options)
    if not opts:
        return None
    n = len(opts)
    m_idx, z_idx = n, n + 1
    roles = [o.candidate.role for o in opts]
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []

    def row() -> np.ndarray:
        return np.zeros(n + 2)

    def add(r: np.ndarray, low: float, high: float) -> None:
        rows.append(r)
        lo.append(low)
        hi.append(high)

    for role, sign in (("prefill", -1.0), ("decode", -1.0), ("mixed", 1.0)):
        r = row()
        r[[i for i in range(n) if roles[i] == role]] = 1.0
        r[m_idx] = sign
        rhs = 1.0 if role == "mixed" else 0.0
        add(r, rhs, rhs)
        e = row()
        for i in range(n):
            if roles[i] == role:
                e[i] = opts[i].score
        e[z_idx] = -1.0
        add(e, -np.inf, 0.0)
    for gpu, count in inventory.items():
        r = row()
        for i, o in enumerate(opts):
            if o.candidate.gpu == gpu:
                r[i] = o.gpus
        add(r, -np.inf, float(count))
    if target > 0:
        r = row()
        r[:n] = [math.log(o.attainment) for o in opts]
        add(r, math.log(target), np.inf)
    for cut in exclude:
        r = row()
        hits = [i for i, o in enumerate(opts) if o in cut]
        if len(hits) < len(cut):
            continue  # an excluded option is not offered: nothing to cut
        r[hits] = 1.0
        add(r, -np.inf, len(cut) - 1.0)
    cost = np.array([o.usd_per_hour for o in opts] + [0.0, 0.0])
    scale = max(float(cost.max()), 1e-9)
    c = np.zeros(n + 2)
    if objective == "p95":
        c[z_idx] = 1.0
        c[:n] = _TIE * np.array([o.score for o in opts])
    else:
        c[:n] = cost[:n] / scale
        c[z_idx] = _TIE
    lb = np.zeros(n + 2)
    ub = np.ones(n + 2)
    ub[z_idx] = np.inf
    if mode is not None:
        if mode not in ("disagg", "mixed"):
            raise ValueError(f"mode must be 'disagg' or 'mixed', got {mode!r}")
        lb[m_idx] = ub[m_idx] = 1.0 if mode == "disagg" else 0.0
    integrality = np.ones(n + 2)
    integrality[z_idx] = 0
    res = milp(c, integrality=integrality, bounds=Bounds(lb, ub),
               constraints=LinearConstraint(np.vstack(rows), lo, hi))
    if res.status != 0 or res.x is None:
        return None
    chosen = tuple(opts[i] for i in range(n) if res.x[i] > 0.5)
    return Solution(chosen, max(o.score for o in chosen), time.perf_counter() - t0)
