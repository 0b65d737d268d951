"""``tokenomy sim``: simulate one or more deployments on a workload and report the whitepaper's metrics.

The flags build an experiment spec (``tokenomy.experiment``; ``--spec FILE`` loads a saved
one); each deployment (and each of its splits) runs once on the workload. Trace and session
files replay whole on their own clock unless ``--rate``/``--duration`` are given; the header
says what ran and any cut or rescaling. JSON schema: docs/json-schemas.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bar

from tokenomy.cli.output import ProgressLines, print_workload
from tokenomy.cli.spec_args import add_experiment_args, spec_from_args
from tokenomy.core import Session
from tokenomy.engine import EventTrace, JsonlTrace
from tokenomy.experiment import (
    ExperimentSpec,
    Job,
    RunResult,
    dump_spec,
    load_sessions,
    plan_jobs,
    run_job,
    sim_payload,
)
from tokenomy.metrics import Summary
from tokenomy.metrics.report import plot_comparison, render_table, write_json
from tokenomy.sim import SimConfig

DEFAULT_DEPLOYMENTS = "colocated,disagg"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="simulate deployments on a workload", description=__doc__)
    add_experiment_args(p, default_deployments=DEFAULT_DEPLOYMENTS)
    p.add_argument("--json", type=Path, default=None, help="write results as JSON here (schema: docs/json-schemas.md)")
    p.add_argument("--plot", type=Path, default=None, help="write a comparison chart (PNG) here")
    p.add_argument("--html", type=Path, default=None,
                   help="write a self-contained HTML report (table, interactive plots) here")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--trace-events", type=Path, default=None, metavar="FILE",
        help="write every engine event (admissions, preemptions, evictions, steps) and policy decision here "
        "as JSON lines (default: none)",
    )
    p.set_defaults(func=run_sim)
    from tokenomy.cli import compare_cmd

    compare_cmd.register(p.add_subparsers(dest="sim_command", metavar="compare", help="sweep rates over deployments"))


def sessions_from_args(args: argparse.Namespace) -> list[Session]:
    """The workload the flags describe (kept for callers of the old entry point)."""
    return load_sessions(spec_from_args(args))[0]


def config_from_args(args: argparse.Namespace, deployment: str) -> SimConfig:
    """The simulator config of ``deployment`` (a variant name, optionally ``@P:D``) under the flags."""
    from tokenomy.experiment import DeploymentSpec

    spec = spec_from_args(args)
    dep = DeploymentSpec.parse(deployment)
    return spec.sim_config(dep, spec.splits_of(dep)[0])


def _job_label(job: Job, several_splits: bool) -> str:
    if job.split and several_splits and not job.deployment.split:
        return f"{job.deployment.name}@{job.split[0]}:{job.split[1]}"
    return job.deployment.label


def run_spec(
    spec: ExperimentSpec, *, console: Console, quiet: bool = False, trace: EventTrace | None = None
) -> tuple[list[RunResult], dict[str, object]]:
    """Run every deployment (and split) of ``spec`` once, in this process; print the workload header.

    With a ``trace``, each run's engine events and policy decisions follow a ``run`` event naming it.
    """
    if spec.rates is not None:
        raise ValueError("this spec sweeps rates: run it with `tokenomy sim compare --spec`")
    sessions, info = load_sessions(spec)
    print_workload(console, info)
    jobs = plan_jobs(spec)
    several = {d.label: len(spec.splits_of(d)) > 1 for d in spec.deployments}
    lines = ProgressLines(len(jobs), quiet=quiet or sys.stderr.isatty())
    runs: list[RunResult] = []
    for job in jobs:
        label = _job_label(job, several[job.deployment.label])
        if trace is not None:
            trace.emit({"t_s": 0.0, "kind": "run", "instance": "", "deployment": label})
        result = _run_one(spec, job, sessions, label, quiet, trace)
        result = RunResult(label, result.split, result.rate_per_s, result.summary, result.num_gpus,
                           result.sim_end_s, result.wall_s)
        lines.done(label, result)
        runs.append(result)
    return runs, info.to_dict()


def _run_one(
    spec: ExperimentSpec, job: Job, sessions: list[Session], label: str, quiet: bool, trace: EventTrace | None
) -> RunResult:
    """One run, with a bar over simulated time on a terminal."""
    if quiet or not sys.stderr.isatty():
        return run_job(spec, job, sessions, trace=trace)
    horizon = spec.cluster.horizon_s or max(s.start_s for s in sessions) + 1.0
    columns = (TextColumn(f"[bold]{label}[/]"), BarColumn(), TextColumn("sim t={task.completed:.0f}s"),
               TimeElapsedColumn())
    with Bar(*columns, transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("sim", total=horizon)
        return run_job(spec, job, sessions, progress=lambda t: bar.update(task, completed=min(t, horizon)),
                       trace=trace)


def plot_title(spec: ExperimentSpec, fmt: str) -> str:
    """``workload: model on N x TP GPU, rate`` for a chart."""
    c, w = spec.cluster, spec.workload
    if w.rate_per_s:
        rate = f"{w.rate_per_s:g} sessions/s"
    else:
        rate = "1 session/s" if fmt.startswith("synthetic") else "trace's own clock"
    return (f"{Path(w.source).name}: {Path(c.model).name} on {c.instances} x TP{c.tp} {Path(c.gpu).name}, "
            f"{rate}")


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """Old name of :func:`tokenomy.cli.spec_args.add_experiment_args` (with ``sim``'s default deployments)."""
    add_experiment_args(p, default_deployments=DEFAULT_DEPLOYMENTS)


def run_sim(args: argparse.Namespace) -> int:
    console = Console()
    spec = spec_from_args(args)
    if args.save_spec:
        dump_spec(spec, args.save_spec)
        console.print(f"wrote {args.save_spec}")
    trace = open_trace(args.trace_events)
    try:
        runs, workload = run_spec(spec, console=console, quiet=args.quiet, trace=trace)
    finally:
        if trace is not None:
            trace.close()
    summaries: dict[str, Summary] = {r.deployment: r.summary for r in runs}
    c = spec.cluster
    title = f"{Path(spec.workload.source).name} on {c.instances} x {c.tp} {Path(c.gpu).name} / {Path(c.model).name}"
    table = render_table(summaries, console=console, title=title)
    if args.html:
        from tokenomy.cli.html_out import write_sim_html

        write_sim_html(args.html, title, table, summaries, spec.slo)
        console.print(f"wrote {args.html}")
    if args.json:
        write_json(args.json, sim_payload(spec, runs, workload))
        console.print(f"wrote {args.json}")
    if args.plot:
        plot_comparison(summaries, args.plot, title=plot_title(spec, str(workload["format"])),
                        slo=spec.slo, splits={r.deployment: r.split for r in runs})
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


__all__ = ["add_cluster_args", "config_from_args", "plot_title", "register", "run_sim", "run_spec", "sessions_from_args"]
