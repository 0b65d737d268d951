"""``plan()``: choose prefill/decode (or mixed) instance shapes and counts for a workload.

Steps: price every candidate shape (``options.build_models``), enumerate its feasible counts,
solve the MILP (``milp.solve``), then explain: which constraint binds and what the
counterfactual ("add prefill", "add decode", "disaggregate") would do, and the runner-up.

A plan is feasible when its predicted SLO attainment (the queueing model's latency distribution
against the SLO bounds) reaches the request's target, 90% by default, the figure every
``max_rate_at_target`` uses; the simulator and the whitepaper judge a run the same way. Among
feasible plans the objective decides (P95 over the SLO, or cost). When none is feasible, the
plan is the best one by P95 and says the shortfall (``Plan.shortfall``: its predicted
attainment, and the rate the inventory carries at the target). Inputs that no plan can serve at
all (every option saturated, weights that fit nowhere, SLO bounds no request could meet alone)
raise :class:`PlanInfeasible` with one line in words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tokenomy.core import SLO
from tokenomy.metrics.goodput import DEFAULT_ATTAINMENT_TARGET
from tokenomy.perf import get_gpu, get_model
from tokenomy.plan.milp import Solution, solve
from tokenomy.plan.options import (
    TP_CHOICES,
    Candidate,
    EngineLimits,
    Option,
    build_models,
    enumerate_options,
    evaluate,
)
from tokenomy.plan.queueing import InstanceModel
from tokenomy.plan.stats import WorkloadStats

MODES = ("disagg", "mixed")
"""Disaggregated prefill/decode pools, or colocated (mixed) instances."""


class PlanInfeasible(ValueError):
    """No plan meets the request; the message says why in one line."""


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for: a model on an inventory of GPUs (canonical name -> count) under SLOs."""

    model: str
    inventory: dict[str, int]
    slo: SLO = field(default_factory=SLO)
    objective: str = "p95"
    gpus_per_node: int = 8
    limits: EngineLimits = field(default_factory=EngineLimits)
    tp_choices: tuple[int, ...] = TP_CHOICES
    modes: tuple[str, ...] = MODES
    attainment_target: float = DEFAULT_ATTAINMENT_TARGET

    def __post_init__(self) -> None:
        if not 0 < self.attainment_target <= 1:
            raise ValueError(f"attainment_target must lie in (0, 1], got {self.attainment_target}")
        if not self.modes or set(self.modes) - set(MODES):
            raise ValueError(f"modes must be a non-empty subset of {MODES}, got {self.modes}")
        if not self.inventory or any(n < 1 for n in self.inventory.values()):
            raise ValueError(f"inventory needs at least one GPU type with >= 1 GPU, got {self.inventory}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")


@dataclass(frozen=True)
class Plan:
    """The chosen topology and why.

    ``binding`` is the constraint that sets the objective, in words; ``runner_up`` the best
    different choice; ``other_mode`` the best plan of the other kind (colocated when the plan
    disaggregates, and vice versa), None when there is none. ``shortfall`` is None when the
    plan's predicted attainment reaches the target, else the gap in words.
    """

    request: PlanRequest
    stats: WorkloadStats
    solution: Solution
    binding: str
    runner_up: Solution | None
    other_mode: Solution | None
    options_considered: int
    candidates: int
    shortfall: str | None = None

    @property
    def chosen(self) -> tuple[Option, ...]:
        return self.solution.chosen

    @property
    def attainment(self) -> float:
        """The chosen plan's predicted SLO attainment."""
        return self.solution.attainment

    def bottleneck(self) -> tuple[Option, str, float]:
        """``(option, metric, predicted P95 seconds)`` of the role with the highest score."""
        opt = max(self.chosen, key=lambda o: o.score)
        p = opt.prediction
        ttft = (p.ttft_p95_s or 0.0) / self.request.slo.ttft_s
        tpot = (p.tpot_p95_s or 0.0) / self.request.slo.tpot_s
        if ttft >= tpot:
            return opt, "ttft", float(p.ttft_p95_s or 0.0)
        return opt, "tpot", float(p.tpot_p95_s or 0.0)


def plan(stats: WorkloadStats, request: PlanRequest, calibration: dict[str, dict[str, float]] | None = None) -> Plan:
    """The best plan for ``stats`` under ``request``; raises :class:`PlanInfeasible`.

    ``calibration`` maps a candidate key to ``{"ttft": factor, "tpot": factor}`` multiplying
    the queueing model's P95s (see :mod:`tokenomy.plan.calibrate`).
    """
    for gpu in request.inventory:
        get_gpu(gpu)  # KeyError naming the known GPUs
    models, misfits = build_models(request.model, request.inventory, stats, request.limits,
                                   request.gpus_per_node, request.tp_choices)
    if not models:
        largest = ", ".join(f"{g} x {min(n, request.gpus_per_node)}" for g, n in request.inventory.items())
        weights = get_model(request.model).weight_bytes / 1e9
        raise PlanInfeasible(f"{request.model} weights ({weights:.0f} GB) do not fit at any TP within a node "
                             f"(largest: {largest}): {misfits[-1]}")
    for cand, m in models.items():
        factors = (calibration or {}).get(cand.key, {})
        m.ttft_factor, m.tpot_factor = factors.get("ttft", 1.0), factors.get("tpot", 1.0)
    _check_physical_minimum(models, request.slo)
    options = _options(models, stats, request)
    objective, target = request.objective, request.attainment_target
    best = solve(options, request.inventory, objective, target=target)
    shortfall = None
    if best is None:  # nothing attains the target: the best by P95, and how far it falls short
        objective, target = "p95", 0.0
        best = solve(options, request.inventory, objective)
        if best is None:
            raise PlanInfeasible(_too_few_gpus(models, stats, request))
        shortfall = _shortfall(best, models, stats, request)
    runner = solve(options, request.inventory, objective, exclude=[best.chosen], target=target)
    other = None
    if len(request.modes) == len(MODES):  # below the target too: `--choose` simulates both kinds
        mode = "mixed" if best.disaggregated else "disagg"
        other = (solve(options, request.inventory, objective, mode=mode, target=target)
                 or solve(options, request.inventory, "p95", mode=mode))
    binding = explain(best, other, models, stats, request)
    return Plan(request, stats, best, binding, runner, other, len(options), len(models), shortfall)


def _check_physical_minimum(models: dict[Candidate, InstanceModel], slo: SLO) -> None:
    """No request could meet a bound even alone on the fastest shape: no plan to offer."""
    ttft_min = min((m.fastest_ttft_s(), c) for c, m in models.items() if c.role != "decode")
    if slo.ttft_s < ttft_min[0]:
        c = ttft_min[1]
        raise PlanInfeasible(f"--slo-ttft {slo.ttft_s:g} s is below the physical minimum {ttft_min[0]:.3f} s "
                             f"(the shortest prompt prefilled alone on {c.tp} x {c.gpu}, no queueing)")
    tpot_min = min((m.zero_load().tpot_p95_s or math.inf, c) for c, m in models.items() if c.role != "prefill")
    if slo.tpot_s < tpot_min[0]:
        c = tpot_min[1]
        raise PlanInfeasible(f"--slo-tpot {slo.tpot_s:g} s is below the physical minimum {tpot_min[0]:.4f} s "
                             f"(one sequence decoding alone on {c.tp} x {c.gpu})")


def _options(models: dict[Candidate, InstanceModel], stats: WorkloadStats, request: PlanRequest) -> list[Option]:
    """Every feasible option of the allowed modes."""
    opts = enumerate_options(models, request.inventory, stats, request.slo)
    return [o for o in opts if ("mixed" if o.candidate.role == "mixed" else "disagg") in request.modes]


def _feasible_at(models: dict[Candidate, InstanceModel], stats: WorkloadStats, request: PlanRequest) -> bool:
    sol = solve(_options(models, stats, request), request.inventory, "p95", target=request.attainment_target)
    return sol is not None


def _max_scale(models: dict[Candidate, InstanceModel], stats: WorkloadStats, request: PlanRequest) -> float:
    """The largest share of the asked rate the inventory serves at the target, by bisection."""
    lo, hi = 0.0, 1.0
    for _ in range(12):
        mid = (lo + hi) / 2
        if _feasible_at(models, stats.scaled(mid), request):
            lo = mid
        else:
            hi = mid
    return lo


def _carried(models: dict[Candidate, InstanceModel], stats: WorkloadStats, request: PlanRequest) -> str:
    """What the inventory carries at the target, in words."""
    lo = _max_scale(models, stats, request)
    gpus = " + ".join(f"{n} x {g}" for g, n in sorted(request.inventory.items()))
    slo = (f"{request.attainment_target:.0%} within TTFT {request.slo.ttft_s:g} s / "
           f"TPOT {request.slo.tpot_s:g} s")
    if lo == 0.0:
        return f"{gpus} cannot carry any load of this workload at {slo}"
    return (f"{gpus} carry at most {stats.session_rate_per_s * lo:.3g} sessions/s "
            f"({stats.request_rate_per_s * lo:.3g} requests/s) at {slo}; asked "
            f"{stats.session_rate_per_s:.3g} sessions/s ({stats.request_rate_per_s:.3g} requests/s)")


def _too_few_gpus(models: dict[Candidate, InstanceModel], stats: WorkloadStats, request: PlanRequest) -> str:
    """Every option saturates at the asked rate: what the inventory carries instead."""
    return f"too few GPUs for the rate: {_carried(models, stats, request)}"


def _shortfall(best: Solution, models: dict[Candidate, InstanceModel], stats: WorkloadStats,
               request: PlanRequest) -> str:
    return (f"predicted SLO attainment {best.attainment:.1%} is below the target {request.attainment_target:.0%}: "
            f"{_carried(models, stats, request)}")


def _shifted(opt: Option, delta_gpus: int, model: InstanceModel, stats: WorkloadStats, slo: SLO) -> Option | None:
    """``opt`` resized by ``delta_gpus`` GPUs (whole instances), None if nothing would be left."""
    count = opt.count + (delta_gpus // opt.candidate.tp if delta_gpus > 0 else -math.ceil(-delta_gpus / opt.candidate.tp))
    return evaluate(opt.candidate, model, count, stats, slo) if count >= 1 else None


def explain(best: Solution, other: Solution | None, models: dict[Candidate, InstanceModel],
            stats: WorkloadStats, request: PlanRequest) -> str:
    """The binding constraint of ``best`` in words, with its counterfactual.

    For a disaggregated plan the counterfactual is moving one instance's worth of GPUs from
    one role to the other: if taking them from decode overflows decode KV (or its batch
    slots) or raises decode P95, decode binds and adding prefill would not help; and
    symmetrically for prefill.
    """
    slo = request.slo
    by_role = {o.candidate.role: o for o in best.chosen}
    if "mixed" in by_role:
        what = _limit_of(by_role["mixed"], slo)
        if other is None and "disagg" in request.modes:
            return f"mixed {what} binds; no disaggregated plan is feasible, so do not disaggregate"
        if other is None:
            return f"mixed {what} binds"
        if other.attainment < request.attainment_target <= best.attainment:
            return (f"mixed {what} binds; do not disaggregate: the best disaggregated plan is predicted to "
                    f"attain {other.attainment:.1%} of the SLO, below the target {request.attainment_target:.0%}")
        if request.objective == "cost":
            return (f"mixed {what} binds; do not disaggregate: the cheapest disaggregated plan costs "
                    f"${other.usd_per_hour:.2f}/hour against ${best.usd_per_hour:.2f}")
        return (f"mixed {what} binds; do not disaggregate: the best disaggregated plan scores "
                f"{other.z:.2f} x SLO against {best.z:.2f}")
    p, d = by_role["prefill"], by_role["decode"]
    fewer_d = _shifted(d, -p.candidate.tp, models[d.candidate], stats, slo)
    d_blocked = fewer_d is None or not fewer_d.prediction.feasible
    if d.score >= p.score or d_blocked:
        kv = d.prediction.kv_utilization
        if fewer_d is None:
            why = "no decode instance would be left"
        elif not fewer_d.prediction.feasible:
            why = f"one decode instance fewer: {fewer_d.prediction.reason}"
        elif fewer_d.score <= d.score * 1.01:
            why = "decode TPOT is at this shape's floor: the batch is too small for queueing to matter"
        else:
            why = f"one decode instance fewer raises decode TPOT P95 to {fewer_d.score:.2f} x SLO"
        limit = "KV" if d_blocked and "KV" in why else "TPOT"
        return (f"decode {limit} binds ({kv:.0%} of decode KV in use at the P95 batch, TPOT P95 at "
                f"{d.score:.2f} x SLO): adding prefill would not help ({why})")
    fewer_p = _shifted(p, -d.candidate.tp, models[p.candidate], stats, slo)
    if fewer_p is None:
        why = "no prefill instance would be left"
    elif not fewer_p.prediction.feasible:
        why = f"one prefill instance fewer: {fewer_p.prediction.reason}"
    elif fewer_p.score <= p.score * 1.01:
        why = "TTFT is at this shape's floor: prefill time, not queueing"
    else:
        why = f"one prefill instance fewer raises TTFT P95 to {fewer_p.score:.2f} x SLO"
    return (f"prefill TTFT binds ({p.prediction.utilization:.0%} busy, TTFT P95 at {p.score:.2f} x SLO): "
            f"adding decode would not help ({why})")


def _limit_of(opt: Option, slo: SLO) -> str:
    p = opt.prediction
    ttft = (p.ttft_p95_s or 0.0) / slo.ttft_s
    tpot = (p.tpot_p95_s or 0.0) / slo.tpot_s
    if ttft >= tpot:
        return "TTFT"
    return "KV" if p.kv_utilization >= tpot else "TPOT"
