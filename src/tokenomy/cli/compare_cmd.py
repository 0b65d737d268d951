"""``tokenomy sim compare``: sweep session rates over several deployments, in parallel.

Prints SLO attainment against rate, the highest rate at which the attainment target (90%,
DistServe's goodput) holds (``max_rate_at_target_rps``), and P99 TTFT/TPOT for each
deployment. Disaggregated deployments take their P:D split from ``NAME@P:D``,
``--prefill/--decode``, or ``--splits`` (``auto``: every P + D = --instances, the best
reported). The sweep runs in the library (``tokenomy.experiment.run_sweep``) on a local process
pool, or on Ray with ``--ray``. JSON schema: docs/json-schemas.md.
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress as Bar
from rich.table import Table

from tokenomy.cli.output import ProgressLines, print_workload
from tokenomy.cli.spec_args import add_experiment_args, spec_from_args
from tokenomy.experiment import Job, Progress, SweepResult, dump_spec, load_sessions, plan_jobs, run_sweep
from tokenomy.metrics.report import plot_sweep, write_json
from tokenomy.workload import SYNTHETIC
from tokenomy.workload.registry import check_synthetic_size

DEFAULT_DEPLOYMENTS = "colocated,disagg,ampd"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="sweep rates over deployments (parallel)", description=__doc__)
    add_experiment_args(p, default_deployments=DEFAULT_DEPLOYMENTS)
    p.add_argument("--rates", default=None, help="comma-separated session arrival rates per second (required "
                                                 "unless --spec gives them)")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: all cores)")
    p.add_argument("--ray", default=None, metavar="auto|local|ADDRESS",
                   help="run on Ray instead of local processes: auto joins this machine's cluster, local "
                        "starts a private one, else a cluster address (needs tokenomy[ray])")
    p.add_argument("--json", type=Path, default=None, help="write results as JSON (schema: docs/json-schemas.md)")
    p.add_argument("--plot", type=Path, default=None, help="write an attainment-vs-rate chart (PNG)")
    p.add_argument("--html", type=Path, default=None,
                   help="write a self-contained HTML report (table, interactive attainment and P99 plots) here")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    console = Console()
    spec = spec_from_args(args)
    if spec.rates is None:
        raise ValueError("--rates is required (or a --spec that gives rates)")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.save_spec:
        dump_spec(spec, args.save_spec)
        console.print(f"wrote {args.save_spec}")
    if spec.workload.source in SYNTHETIC:  # the highest rate makes the most sessions: refuse it up front
        check_synthetic_size(spec.workload.source, max(spec.rates), spec.workload.duration_s)
    # Load once here: bad input fails before any worker starts, and the header says what runs.
    print_workload(console, load_sessions(spec, spec.rates[0])[1])
    total = len(plan_jobs(spec))
    console.print(f"{total} simulations ({len(spec.deployments)} deployments x splits x {len(spec.rates)} rates)")
    executor = "ray" if args.ray else "pool"
    cpu0 = _cpu_s()
    if args.quiet or not sys.stderr.isatty():
        lines = ProgressLines(total, quiet=args.quiet)
        result = run_sweep(spec, executor=executor, workers=args.workers, address=args.ray,
                           on_progress=lambda p: lines.done(_job_label(p.job), p.result))
    else:
        with Bar(transient=True, console=Console(stderr=True)) as bar:
            task = bar.add_task(f"{total} simulations", total=total)

            def advance(p: Progress) -> None:
                bar.advance(task)

            result = run_sweep(spec, executor=executor, workers=args.workers, address=args.ray,
                               on_progress=advance)
    table = _print(console, result)
    where = "this process; the Ray workers' CPU is not counted" if args.ray else "this process and its workers"
    console.print(f"{total} simulations took {_cpu_s() - cpu0:.1f} CPU s ({where})", highlight=False)
    if args.html:
        from tokenomy.cli.html_out import write_compare_html

        curves = {_label(n, cv.split): [r.summary for r in cv.runs] for n, cv in result.best.items()}
        write_compare_html(args.html, Path(spec.workload.source).name, table, list(spec.rates), curves,
                           spec.attainment_target, spec.slo)
        console.print(f"wrote {args.html}")
    if args.json:
        write_json(args.json, result.to_dict())
        console.print(f"wrote {args.json}")
    if args.plot:
        c = spec.cluster
        series = {_label(n, cv.split): cv.attainment for n, cv in result.best.items()}
        title = (f"{Path(spec.workload.source).name}: {Path(c.model).name} on {c.instances} x TP{c.tp} "
                 f"{Path(c.gpu).name}; SLO TTFT <= {spec.slo.ttft_s:g} s, TPOT <= {spec.slo.tpot_s * 1e3:g} ms")
        plot_sweep(list(spec.rates), series, args.plot, xlabel="session rate (1/s)", title=title,
                   target=spec.attainment_target)
        console.print(f"wrote {args.plot}")
    return 0


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the local pool's workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _job_label(job: Job) -> str:
    if job.split and not job.deployment.split:
        return f"{job.deployment.name}@{job.split[0]}:{job.split[1]}"
    return job.deployment.label


def _label(name: str, split: tuple[int, int] | None) -> str:
    return f"{name} ({split[0]}P:{split[1]}D)" if split and "@" not in name else name


def _print(console: Console, result: SweepResult) -> Table:
    spec = result.spec
    table = Table(title=f"SLO attainment vs session rate — {Path(spec.workload.source).name}")
    table.add_column("deployment")
    for r in result.rates:
        table.add_column(f"{r:g}/s", justify="right")
    table.add_column(f"max rate at {spec.attainment_target:.0%}", justify="right")
    table.add_column("P99 TTFT / TPOT at max rate", justify="right")
    for name, curve in result.best.items():
        cells = [f"{a:.1%}" for a in curve.attainment]
        last = curve.runs[-1].summary
        ttft, tpot = last.ttft_p99_s, last.tpot_p99_s
        tail = f"{ttft:.2f}s / {tpot * 1000:.0f}ms" if ttft is not None and tpot is not None else "-"
        table.add_row(_label(name, curve.split), *cells, f"{curve.max_rate_at_target:.2f}/s", tail)
    console.print(table)
    return table
