"""``tokenomy sim``: simulate one or more deployments on a workload and report the whitepaper's metrics."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tokenomy.core import SLO, Session
from tokenomy.engine import EventTrace, JsonlTrace
from tokenomy.metrics import Summary
from tokenomy.metrics.report import plot_comparison, render_table, write_json
from tokenomy.sim import SimConfig, SimResult, simulate
from tokenomy.workload.registry import load_workload


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """Options shared by ``sim`` and ``sim compare``: workload, cluster, SLOs."""
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default="gaia", help="chat | gaia | toolbench | path to a trace or session file")
    g.add_argument("--rate", type=float, default=1.0, help="session arrivals per second (synthetic workloads)")
    g.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals")
    g.add_argument("--arrival", default="poisson", help="poisson | gamma")
    g.add_argument("--arrival-cv", type=float, default=1.0, help="coefficient of variation for gamma arrivals")
    g.add_argument("--max-sessions", type=int, default=None, help="cap on sessions taken from the workload")
    g.add_argument("--seed", type=int, default=0)
    c = p.add_argument_group("cluster")
    c.add_argument("--model", default="llama-3.1-8b")
    c.add_argument("--gpu", default="h100")
    c.add_argument("--tp", type=int, default=1)
    c.add_argument("--instances", type=int, default=8, help="colocated: mixed instances")
    c.add_argument("--prefill", type=int, default=None, help="disaggregated: prefill instances (default: half)")
    c.add_argument("--decode", type=int, default=None, help="disaggregated: decode instances (default: the rest)")
    c.add_argument("--router", default="prefix_aware")
    c.add_argument("--max-num-batched-tokens", type=int, default=8192)
    c.add_argument("--max-num-seqs", type=int, default=256)
    c.add_argument("--horizon", type=float, default=None, help="stop the clock here; unfinished requests miss the SLO")
    c.add_argument("--plan", type=Path, default=None, help="a plan file from `tokenomy plan --out`: its topology")
    s = p.add_argument_group("SLO")
    s.add_argument("--slo-ttft", type=float, default=SLO().ttft_s, help="TTFT bound, seconds")
    s.add_argument("--slo-tpot", type=float, default=SLO().tpot_s, help="TPOT bound, seconds (vLLM definition)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="simulate deployments on a workload", description=__doc__)
    add_cluster_args(p)
    p.add_argument("--deployment", default="colocated,disagg", help="comma-separated: colocated, disagg, ...")
    p.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    p.add_argument("--plot", type=Path, default=None, help="write a comparison chart (PNG) here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--trace-events", type=Path, default=None, metavar="FILE",
        help="write every engine event (admissions, preemptions, evictions, steps) here as JSON lines",
    )
    p.set_defaults(func=run_sim)
    from tokenomy.cli import compare_cmd

    compare_cmd.register(p.add_subparsers(dest="sim_command"))


def sessions_from_args(args: argparse.Namespace) -> list[Session]:
    sessions = load_workload(
        args.workload,
        rate_per_s=args.rate,
        duration_s=args.duration,
        seed=args.seed,
        arrival=args.arrival,
        arrival_cv=args.arrival_cv,
        max_sessions=args.max_sessions,
    )
    if not sessions:
        raise ValueError(f"workload {args.workload!r} produced no sessions (rate {args.rate}/s over {args.duration} s)")
    return sessions


def config_from_args(args: argparse.Namespace, deployment: str) -> SimConfig:
    total = args.instances
    prefill = args.prefill if args.prefill is not None else max(1, total // 2)
    decode = args.decode if args.decode is not None else max(1, total - prefill)
    config = SimConfig(
        deployment=deployment,
        model=args.model,
        gpu=args.gpu,
        tp=args.tp,
        instances=total,
        prefill=prefill,
        decode=decode,
        router=args.router,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        horizon_s=args.horizon,
    )
    if getattr(args, "plan", None) is not None:  # the plan's topology replaces the cluster flags
        from tokenomy.plan.planfile import sim_overrides

        return replace(config, **sim_overrides(args.plan))
    return config


def run_with_progress(
    sessions: list[Session], config: SimConfig, slo: SLO, quiet: bool, trace: EventTrace | None = None
) -> SimResult:
    """Simulate with a progress bar over simulated time (hidden when ``quiet``)."""
    if quiet:
        return simulate(sessions, config, slo, trace=trace)
    horizon = config.horizon_s or max(s.start_s for s in sessions) + 1.0
    with Progress(
        TextColumn(f"[bold]{config.deployment}[/]"),
        BarColumn(),
        TextColumn("sim t={task.completed:.0f}s"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task("sim", total=horizon)
        result = simulate(
            sessions, config, slo, progress=lambda t: bar.update(task, completed=min(t, horizon)), trace=trace
        )
    return result


def deployment_payload(summary: Summary, result: SimResult) -> dict[str, Any]:
    d = summary.to_dict()
    d["num_gpus"] = result.num_gpus
    d["sim_end_s"] = result.sim_end_s
    d["wall_s"] = round(result.wall_s, 3)
    return d


def run_sim(args: argparse.Namespace) -> int:
    console = Console()
    slo = SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot)
    names = [n.strip() for n in args.deployment.split(",") if n.strip()]
    if args.plan is not None:
        names = [config_from_args(args, "colocated").deployment]
    if not names:
        raise ValueError("--deployment needs at least one name")
    sessions = sessions_from_args(args)
    n_requests = sum(len(s.turns) for s in sessions)
    console.print(f"workload [bold]{args.workload}[/]: {len(sessions)} sessions, {n_requests} requests")
    summaries: dict[str, Summary] = {}
    payload: dict[str, Any] = {"deployments": {}, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}}
    trace = open_trace(args.trace_events)
    try:
        for name in names:
            config = config_from_args(args, name)
            if trace is not None:  # the events that follow, up to the next "run", are this deployment's
                trace.emit({"t_s": 0.0, "kind": "run", "instance": "", "deployment": name})
            result = run_with_progress(sessions, config, slo, args.quiet, trace)
            summaries[name] = result.summary
            payload["deployments"][name] = deployment_payload(result.summary, result)
    finally:
        if trace is not None:
            trace.close()
    render_table(summaries, console=console, title=f"{args.workload} on {args.model} / {args.gpu}")
    if args.json:
        write_json(args.json, payload)
        console.print(f"wrote {args.json}")
    if args.plot:
        plot_comparison(summaries, args.plot)
        console.print(f"wrote {args.plot}")
    if trace is not None:
        console.print(f"wrote {trace.num_events} events to {args.trace_events}")
    return 0


def open_trace(path: Path | None) -> JsonlTrace | None:
    if path is None:
        return None
    try:
        return JsonlTrace(path)
    except OSError as exc:
        raise ValueError(f"--trace-events {path}: cannot write: {exc.strerror or exc}") from None


__all__ = ["add_cluster_args", "config_from_args", "register", "run_sim", "sessions_from_args"]
