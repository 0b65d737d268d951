"""``tokenomy plan``: choose P/D (or mixed) instance counts, TP and GPU types for a workload.

Prints the topology, its predicted SLO attainment, each node's predicted utilisation and P95,
the binding constraint in words and the runner-up (a plan below the attainment target is still
printed, with its shortfall); ``--out plan.yaml`` saves it for ``tokenomy sim --plan``. Inputs no
plan can serve at all (SLO below the physical minimum, weights that fit nowhere, every option
saturated at the rate) are one line on stderr and exit status 2. See docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tokenomy.core import SLO
from tokenomy.metrics.goodput import DEFAULT_ATTAINMENT_TARGET
from tokenomy.perf import get_gpu
from tokenomy.plan import EngineLimits, Plan, PlanRequest, plan, workload_stats
from tokenomy.plan.calibrate import CalibrationCache, calibrate_plan_inputs
from tokenomy.plan.layout import place
from tokenomy.plan.milp import OBJECTIVES
from tokenomy.plan.planfile import plan_to_dict, write_plan
from tokenomy.workload.registry import load_workload


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan a deployment (P:D, TP, GPU types) for a workload", description=__doc__)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpus", default="h100:16", help="inventory, TYPE:COUNT[,TYPE:COUNT], e.g. h100:16,h20:16")
    p.add_argument("--gpus-per-node", type=int, default=8, help="TP stays within a node")
    p.add_argument("--workload", default="gaia", help="chat | gaia | toolbench | a trace or session file")
    p.add_argument("--rate", type=float, default=1.0, help="session arrivals per second to plan for")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of workload sampled for its distributions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft", type=float, default=SLO().ttft_s, help="TTFT bound, seconds")
    p.add_argument("--slo-tpot", type=float, default=SLO().tpot_s, help="TPOT bound, seconds")
    p.add_argument("--attainment-target", type=float, default=DEFAULT_ATTAINMENT_TARGET,
                   help="a plan is feasible when this share of requests is predicted within both SLO bounds "
                        f"(default {DEFAULT_ATTAINMENT_TARGET:g})")
    p.add_argument("--objective", default="p95", choices=OBJECTIVES,
                   help="p95: min the worst role's P95/SLO; cost: min $/hour; both among plans attaining the target")
    p.add_argument("--mode", default="auto", choices=("auto", "disagg", "colocated"),
                   help="auto: let the planner say whether to disaggregate")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--calibrate", action="store_true",
                   help="fit the queueing model to short one-instance simulations (cached)")
    p.add_argument("--calibration-cache", type=Path, default=None,
                   help="calibration cache file (default: ~/.cache/tokenomy/plan-calibration.json)")
    p.add_argument("--choose", action="store_true",
                   help="also choose the deployment: simulate AMPD, disagg and colocated, each with and without "
                        "the host KV tier, on the planned pools at --rate (an independent sample, seed + 1) and "
                        "say which to run and why; --out then records it for `tokenomy sim --plan`")
    p.add_argument("--choose-duration", type=float, default=120.0,
                   help="seconds of workload each --choose simulation runs (default 120)")
    p.add_argument("--workers", type=int, default=1, help="processes for --choose's simulations (all at once)")
    p.add_argument("--ray", default=None, metavar="auto|local|ADDRESS",
                   help="run --choose's simulations on Ray: auto joins a running cluster, local starts a private "
                        "one, else a cluster address (needs tokenomy[ray])")
    p.add_argument("--out", type=Path, default=None, help="write the plan here (YAML)")
    p.add_argument("--json", type=Path, default=None, help="write the plan here as JSON")
    p.add_argument("--html", type=Path, default=None, help="write a self-contained HTML report (tables, plots) here")
    p.set_defaults(func=run_plan)


def parse_inventory(text: str) -> dict[str, int]:
    """``"h100:16,h20:8"`` -> ``{"H100-SXM": 16, "H20": 8}``; ValueError (one line) on bad input."""
    inventory: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, count = part.partition(":")
        try:
            n = int(count)
        except ValueError:
            n = 0
        if not sep or n < 1:
            raise ValueError(f"--gpus: expected TYPE:COUNT with COUNT >= 1, got {part!r}")
        try:
            gpu = get_gpu(name).name
        except KeyError as exc:
            raise ValueError(f"--gpus: {exc.args[0]}") from None
        inventory[gpu] = inventory.get(gpu, 0) + n
    if not inventory:
        raise ValueError("--gpus: no GPUs given")
    return inventory


def run_plan(args: argparse.Namespace) -> int:
    console = Console()
    if not args.rate > 0:
        raise ValueError(f"--rate must be > 0, got {args.rate}")
    if not args.duration > 0:
        raise ValueError(f"--duration must be > 0, got {args.duration}")
    request = PlanRequest(
        model=args.model,
        inventory=parse_inventory(args.gpus),
        slo=SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot),
        objective=args.objective,
        gpus_per_node=args.gpus_per_node,
        modes={"auto": ("disagg", "mixed"), "disagg": ("disagg",), "colocated": ("mixed",)}[args.mode],
        limits=EngineLimits(max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs),
        attainment_target=args.attainment_target,
    )
    sessions = load_workload(args.workload, rate_per_s=args.rate, duration_s=args.duration, seed=args.seed)
    stats = workload_stats(args.workload, sessions, args.rate)
    calibration = None
    if args.calibrate:
        cache = CalibrationCache(args.calibration_cache)
        calibration = calibrate_plan_inputs(request, stats, sessions, cache, on_progress=console.print)
    result = plan(stats, request, calibration)
    table, lines = print_plan(console, result)
    choice = _choose(console, args, result) if args.choose else None
    if args.html:
        from tokenomy.cli.html_out import write_plan_html

        write_plan_html(args.html, f"{request.model}, {args.workload} at {args.rate:g} sessions/s", table, lines,
                        _bars(result))
        console.print(f"wrote {args.html}")
    if args.out:
        write_plan(result, args.out, choice)
        console.print(f"wrote {args.out}")
    if args.json:
        args.json.write_text(json.dumps(plan_to_dict(result, choice), indent=2))
        console.print(f"wrote {args.json}")
    return 0


def _choose(console: Console, args: argparse.Namespace, result: Plan) -> dict[str, Any]:
    """Simulate every deployment on the planned pools and say which to run (experiment.choose)."""
    from tokenomy.experiment.choose import choose_on, plan_topologies
    from tokenomy.experiment.spec import WorkloadSpec
    from tokenomy.sim.variants import is_disaggregated

    if not args.choose_duration > 0:
        raise ValueError(f"--choose-duration must be > 0, got {args.choose_duration}")
    workload = WorkloadSpec(args.workload, rate_per_s=args.rate, duration_s=args.choose_duration, seed=args.seed)
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    choice = choose_on(plan_topologies(result, workload), args.rate, workers=args.workers,
                       executor="ray" if args.ray else "pool", address=args.ray)
    console.print(f"[bold]deployment: {choice.label}[/] (simulated {args.choose_duration:g} s at {args.rate:g} "
                  f"sessions/s on the planned pools, seed {args.seed + 1})")
    console.print(f"why: {choice.why}")
    return {**choice.to_dict(), "disaggregated": is_disaggregated(choice.deployment)}


def _topology(options: tuple) -> str:
    return " + ".join(f"{o.count} x {o.candidate.role} ({o.candidate.tp} x {o.candidate.gpu})" for o in options)


def _bars(result: Plan) -> dict[str, tuple[float | None, float | None, float]]:
    """Per chosen instance kind: (TTFT P95 / SLO, TPOT P95 / SLO, utilisation)."""
    slo = result.request.slo
    out: dict[str, tuple[float | None, float | None, float]] = {}
    for o in result.solution.chosen:
        p, c = o.prediction, o.candidate
        out[f"{o.count} x {c.role} tp{c.tp} {c.gpu}"] = (
            None if p.ttft_p95_s is None else p.ttft_p95_s / slo.ttft_s,
            None if p.tpot_p95_s is None else p.tpot_p95_s / slo.tpot_s, p.utilization)
    return out


def print_plan(console: Console, result: Plan) -> tuple[Table, list[str]]:
    """Print the plan; return its per-node table and the lines around it (for --html)."""
    req, st, sol = result.request, result.stats, result.solution
    lines = [f"{req.model} for {st.name} at {st.session_rate_per_s:g} sessions/s "
             f"({st.request_rate_per_s:.3g} requests/s), SLO TTFT {req.slo.ttft_s:g} s / TPOT {req.slo.tpot_s:g} s, "
             f"objective {req.objective}",
             f"topology: {_topology(sol.chosen)}  (${sol.usd_per_hour:.2f}/hour)"]
    for line in lines:
        console.print(line, highlight=False)
    table = Table(title="predicted per node")
    for col in ("node", "instances", "GPUs", "util", "KV", "TTFT P95", "TPOT P95"):
        table.add_column(col, justify="left" if col in ("node", "instances") else "right")
    for node in place(sol.chosen, req.inventory, req.gpus_per_node):
        if not node.instances:
            table.add_row(node.name, "idle", f"0/{node.gpus}", "-", "-", "-", "-")
            continue
        kinds = sorted({o.candidate for o in node.instances})
        for cand in kinds:
            opt = next(o for o in node.instances if o.candidate == cand)
            n = sum(1 for o in node.instances if o.candidate == cand)
            p = opt.prediction
            table.add_row(node.name, f"{n} x {cand.role} tp{cand.tp}", f"{node.used}/{node.gpus}",
                          f"{p.utilization:.0%}", f"{p.kv_utilization:.0%}" if cand.role != "prefill" else "-",
                          f"{p.ttft_p95_s:.3f} s" if p.ttft_p95_s is not None else "-",
                          f"{p.tpot_p95_s * 1000:.1f} ms" if p.tpot_p95_s is not None else "-")
    console.print(table)
    _, metric, p95 = result.bottleneck()
    after = [f"predicted SLO attainment: {result.attainment:.1%} (target {req.attainment_target:.0%})",
             f"bottleneck P95: {metric.upper()} {p95:.3f} s = {sol.z:.2f} x SLO", f"binding: {result.binding}"]
    if result.shortfall is not None:
        after.insert(0, f"shortfall: {result.shortfall}")
    if result.runner_up is not None:
        after.append(f"runner-up: {_topology(result.runner_up.chosen)} at {result.runner_up.z:.2f} x SLO, "
                     f"predicted attainment {result.runner_up.attainment:.1%}")
    if result.other_mode is not None:
        kind = "colocated" if sol.disaggregated else "disaggregated"
        after.append(f"best {kind}: {_topology(result.other_mode.chosen)} at {result.other_mode.z:.2f} x SLO, "
                     f"predicted attainment {result.other_mode.attainment:.1%}")
    after.append(f"{result.candidates} candidate shapes, {result.options_considered} (shape, count) options, "
                 f"MILP solved in {sol.solve_s * 1000:.0f} ms")
    for line in after:
        console.print(line, highlight=False)
    return table, lines + after
