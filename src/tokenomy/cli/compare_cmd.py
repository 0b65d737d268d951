"""``tokenomy sim compare``: sweep request rates over several deployments, in parallel.

Prints SLO attainment against rate, DistServe goodput (the highest rate at which 90% of
requests meet both SLOs) and P99 TTFT/TPOT for each deployment; writes JSON shaped
``{"rates": [...], "deployments": {"<name>": {"slo_attainment": [...], "goodput_rps": x, ...}}}``.

Disaggregated deployments take their P:D split from ``--prefill/--decode``, or with
``--splits auto`` every split of the instances is tried and the one with the best goodput
(then mean attainment) is reported: the baseline at its best static split. A name may pin its
own split with a suffix, e.g. ``ampd@2:6``.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tokenomy.core import SLO
from tokenomy.metrics import max_rate_at_attainment
from tokenomy.metrics.report import plot_sweep, write_json
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import VARIANTS, is_disaggregated, make_variant


def register(sub: argparse._SubParsersAction) -> None:
    from tokenomy.cli.sim_cmd import add_cluster_args

    p = sub.add_parser("compare", help="sweep rates over deployments (parallel)", description=__doc__)
    add_cluster_args(p)
    p.add_argument("--deployments", default="colocated,disagg,ampd", help=f"comma-separated of: {', '.join(VARIANTS)}")
    p.add_argument("--rates", required=True, help="comma-separated session arrival rates per second")
    p.add_argument(
        "--splits",
        default="fixed",
        help="fixed (use --prefill/--decode) | auto (best of every P:D) | a list like 1:7,2:6,3:5 (best of those)",
    )
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    p.set_defaults(func=run_compare)


@dataclass(frozen=True)
class Job:
    variant: str
    rate: float
    prefill: int
    decode: int


def _run_job(args: argparse.Namespace, job: Job) -> dict[str, Any]:
    """One simulation in a worker process (sessions regenerated there: deterministic by seed)."""
    from tokenomy.cli.sim_cmd import config_from_args, sessions_from_args

    overrides: dict[str, Any] = {"rate": job.rate}
    if job.prefill:
        overrides.update(prefill=job.prefill, decode=job.decode)
    args = argparse.Namespace(**{**vars(args), **overrides})
    sessions = sessions_from_args(args)
    base: SimConfig = config_from_args(args, "colocated")
    config = make_variant(_parse_name(job.variant)[0], base)
    slo = SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot)
    s = simulate(sessions, config, slo).summary
    return {
        "slo_attainment": s.slo_attainment,
        "goodput_rps": s.goodput_rps,
        "ttft_p50_s": s.ttft_p50_s,
        "ttft_p99_s": s.ttft_p99_s,
        "tpot_p50_s": s.tpot_p50_s,
        "tpot_p99_s": s.tpot_p99_s,
        "cost_per_mtok_usd": s.cost_per_mtok_usd,
        "mfu": s.mfu,
    }


def _parse_name(label: str) -> tuple[str, tuple[int, int] | None]:
    """``name`` or ``name@P:D`` -> (variant name, pinned split or None)."""
    name, _, split = label.partition("@")
    if not split:
        return name, None
    try:
        p, d = (int(x) for x in split.split(":"))
    except ValueError:
        raise ValueError(f"bad split in {label!r}: expected NAME@P:D, e.g. ampd@2:6") from None
    if p < 1 or d < 1:
        raise ValueError(f"bad split in {label!r}: both sides need >= 1 instance")
    return name, (p, d)


def _splits(args: argparse.Namespace, label: str) -> list[tuple[int, int]]:
    variant, pinned = _parse_name(label)
    if not is_disaggregated(variant):
        return [(0, 0)]
    if pinned is not None:
        return [pinned]
    if args.splits == "auto":
        return [(p, args.instances - p) for p in range(1, args.instances)]
    if args.splits != "fixed":
        return [_parse_name(f"x@{s}")[1] or (0, 0) for s in args.splits.split(",")]
    prefill = args.prefill if args.prefill is not None else max(1, args.instances // 2)
    decode = args.decode if args.decode is not None else max(1, args.instances - prefill)
    return [(prefill, decode)]


def _parse_rates(text: str) -> list[float]:
    try:
        rates = sorted(float(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise ValueError(f"--rates must be comma-separated numbers, got {text!r}") from None
    if not rates or rates[0] <= 0:
        raise ValueError(f"--rates needs positive numbers, got {text!r}")
    return rates


def run_compare(args: argparse.Namespace) -> int:
    console = Console()
    rates = _parse_rates(args.rates)
    if args.plan is not None:  # the plan's deployment at its own split
        from tokenomy.plan.planfile import deployment_label

        args.deployments = deployment_label(args.plan)
    names = [n.strip() for n in args.deployments.split(",") if n.strip()]
    for n in names:
        make_variant(_parse_name(n)[0], SimConfig())  # fail fast on unknown names
    jobs = [Job(n, r, p, d) for n in names for (p, d) in _splits(args, n) for r in rates]
    results: dict[Job, dict[str, Any]] = {}
    workers = args.workers or os.cpu_count() or 1
    with ProcessPoolExecutor(max_workers=workers) as pool, Progress(transient=True, console=console) as bar:
        task = bar.add_task(f"{len(jobs)} simulations", total=len(jobs))
        futures = {pool.submit(_run_job, args, job): job for job in jobs}
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            bar.advance(task)
    payload: dict[str, Any] = {
        "rates": rates,
        "workload": args.workload,
        "slo": {"ttft_s": args.slo_ttft, "tpot_s": args.slo_tpot},
        "deployments": {},
    }
    for n in names:
        payload["deployments"][n] = _best_split(n, rates, _splits(args, n), results)
    _print(console, rates, payload)
    if args.json:
        write_json(args.json, payload)
        console.print(f"wrote {args.json}")
    if args.plot:
        series = {n: d["slo_attainment"] for n, d in payload["deployments"].items()}
        plot_sweep(rates, series, args.plot, xlabel="session rate (1/s)")
        console.print(f"wrote {args.plot}")
    return 0


def _best_split(
    name: str, rates: list[float], splits: list[tuple[int, int]], results: dict[Job, dict[str, Any]]
) -> dict[str, Any]:
    best: dict[str, Any] | None = None
    for prefill, decode in splits:
        rows = [results[Job(name, r, prefill, decode)] for r in rates]
        att = [row["slo_attainment"] for row in rows]
        entry: dict[str, Any] = {key: [row[key] for row in rows] for key in rows[0]}
        entry["goodput_rps"] = max_rate_at_attainment(rates, att)
        entry["goodput_rps_per_rate"] = [row["goodput_rps"] for row in rows]
        if prefill:
            entry["split"] = {"prefill": prefill, "decode": decode}
        score = (entry["goodput_rps"], sum(att))
        if best is None or score > (best["goodput_rps"], sum(best["slo_attainment"])):
            best = entry
    assert best is not None
    return best


def _print(console: Console, rates: list[float], payload: dict[str, Any]) -> None:
    table = Table(title=f"SLO attainment vs session rate — {payload['workload']}")
    table.add_column("deployment")
    for r in rates:
        table.add_column(f"{r:g}/s", justify="right")
    table.add_column("goodput (90%)", justify="right")
    table.add_column("P99 TTFT / TPOT at max rate", justify="right")
    for name, d in payload["deployments"].items():
        split = d.get("split")
        label = f"{name} ({split['prefill']}P:{split['decode']}D)" if split else name
        cells = [f"{a:.1%}" for a in d["slo_attainment"]]
        ttft, tpot = d["ttft_p99_s"][-1], d["tpot_p99_s"][-1]
        tail = f"{ttft:.2f}s / {tpot * 1000:.0f}ms" if ttft is not None and tpot is not None else "-"
        table.add_row(label, *cells, f"{d['goodput_rps']:.2f}/s", tail)
    console.print(table)
