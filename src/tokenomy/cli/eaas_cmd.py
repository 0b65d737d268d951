"""``tokenomy eaas``: run one expert server, a failover demo, or the elastic-scaling cost model."""

from __future__ import annotations

import argparse

from tokenomy.cli.common import CLIError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eaas", help="Expert-as-a-Service: expert servers, failover demo, scaling plan")
    eaas = p.add_subparsers(dest="eaas_command", required=True)

    from tokenomy.eaas.server_args import build_parser

    serve = eaas.add_parser("serve", help="run one stateless expert server until SIGTERM/Ctrl-C")
    build_parser(serve)
    serve.set_defaults(func=_serve)

    demo = eaas.add_parser("demo", help="start servers and a client, stream tokens, show failover")
    demo.add_argument("--servers", type=int, default=4, help="expert servers to start")
    demo.add_argument("--replicas", type=int, default=2, help="servers holding each expert")
    demo.add_argument("--tokens", type=int, default=None, help="stop after this many tokens (default: by time)")
    demo.add_argument("--seconds", type=float, default=6.0, help="stream duration")
    demo.add_argument("--kill-one-at", type=float, default=None, metavar="SECONDS",
                      help="SIGKILL one server this many seconds into the stream")
    demo.add_argument("--batch-tokens", type=int, default=32, help="tokens per micro-batch")
    demo.add_argument("--preset", default="deepseek-tiny", help="model shape preset")
    demo.add_argument("--json", default=None, metavar="OUT", help="also write the report as JSON")
    demo.set_defaults(func=_demo)

    plan = eaas.add_parser("plan", help="GPU-hours: one-GPU elastic experts vs fixed-unit monolithic scaling")
    plan.add_argument("--unit-gpus", type=int, default=320, help="monolithic scaling unit (DeepSeek-V3: 320)")
    plan.add_argument("--peak-gpus", type=float, default=960.0, help="GPUs the daily peak needs")
    plan.add_argument("--trough-fraction", type=float, default=0.3, help="night demand as a fraction of peak")
    plan.add_argument("--hours", type=float, default=24.0, help="horizon")
    plan.add_argument("--step-hours", type=float, default=1.0, help="re-scaling interval")
    plan.add_argument("--peak-hour", type=float, default=14.0, help="hour of the daily peak")
    plan.add_argument("--elastic-step-gpus", type=int, default=1, help="EAAS scaling granularity")
    plan.add_argument("--headroom", type=float, default=0.0, help="extra capacity fraction on both sides")
    plan.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON")
    plan.set_defaults(func=_plan)


def require_eaas_extra() -> None:
    """Fail with one line when the ``eaas`` extra (torch, pyzmq) is not installed."""
    from importlib.util import find_spec

    missing = [name for name in ("torch", "zmq") if find_spec(name) is None]
    if missing:
        raise CLIError(f"{' and '.join(missing)} not installed: install tokenomy[eaas] (pip install 'tokenomy[eaas]')")


def _serve(args: argparse.Namespace) -> int:
    require_eaas_extra()
    from tokenomy.eaas.server import run_from_args

    return run_from_args(args)


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    if args.kill_one_at is not None and args.kill_one_at >= args.seconds:
        raise CLIError(f"--kill-one-at {args.kill_one_at} must be less than --seconds {args.seconds}")
    require_eaas_extra()
    from tokenomy.eaas.failover import FailoverConfig, run_failover

    cfg = FailoverConfig(n_servers=args.servers, replicas=args.replicas, duration_s=args.seconds,
                         kill_at_s=args.kill_one_at, batch_tokens=args.batch_tokens, max_tokens=args.tokens,
                         preset=args.preset, warmup_s=min(0.5, (args.kill_one_at or args.seconds) / 2))
    console = Console()
    console.print(f"starting {cfg.n_servers} expert servers ({cfg.preset}, every expert on {cfg.replicas}) ...")
    rep = run_failover(cfg)
    console.print("tokens/s per second: " + " ".join(f"{t:.0f}" for t in rep.per_second_tps))
    if rep.killed_server is not None:
        console.print(f"killed {rep.killed_server} (SIGKILL) at {cfg.kill_at_s}s; groups resent: {rep.failovers}")
        console.print(f"throughput before {rep.throughput_before_tps:.0f} tok/s, during recovery "
                      f"({cfg.recovery_window_s}s) {rep.throughput_during_tps:.0f}, after "
                      f"{rep.throughput_after_tps:.0f}; drop {100 * rep.drop_fraction:.1f}%")
    else:
        console.print(f"throughput {rep.throughput_before_tps:.0f} tok/s")
    table = Table(title="per-server load (tokens sent)")
    table.add_column("server")
    table.add_column("tokens", justify="right")
    for sid, n in sorted(rep.server_tokens.items()):
        table.add_row(sid + (" (killed)" if sid == rep.killed_server else ""), str(n))
    console.print(table)
    ok = rep.lost_tokens == 0 and rep.wrong_tokens == 0
    console.print(f"tokens done {rep.tokens_done}, lost {rep.lost_tokens}, wrong {rep.wrong_tokens} "
                  f"(max |err| vs monolithic {rep.max_abs_err:.2e}) -> {'OK' if ok else 'FAILED'}")
    _write_json(args, "tokenomy.eaas-demo/1", rep.to_json())
    return 0 if ok else 1


def _plan(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tokenomy.eaas.plan import compare_scaling, diurnal_curve

    demand = diurnal_curve(args.peak_gpus, args.trough_fraction, args.hours, args.step_hours, args.peak_hour)
    c = compare_scaling(demand, args.step_hours, args.unit_gpus, args.elastic_step_gpus, args.headroom)
    table = Table(title=f"GPUs per {args.step_hours:g} h step (unit {args.unit_gpus} GPUs)")
    for col in ("hour", "demand", "EAAS (elastic)", "monolithic (units)"):
        table.add_column(col, justify="right")
    for i, (d, e, u) in enumerate(zip(c.demand_gpus, c.elastic_gpus, c.unit_gpus, strict=True)):
        table.add_row(f"{i * args.step_hours:g}", f"{d:.0f}", str(e), str(u))
    console = Console()
    console.print(table)
    console.print(f"GPU-hours: EAAS {c.elastic_gpu_hours:.0f}, monolithic in {args.unit_gpus}-GPU units "
                  f"{c.unit_gpu_hours:.0f}, static at peak {c.static_gpu_hours:.0f}")
    console.print(f"saving: {100 * c.saving_vs_unit:.1f}% vs unit scaling, "
                  f"{100 * c.saving_vs_static:.1f}% vs static peak provisioning")
    _write_json(args, "tokenomy.eaas-plan/1", {"elastic_gpu_hours": c.elastic_gpu_hours, "unit_gpu_hours": c.unit_gpu_hours,
                            "static_gpu_hours": c.static_gpu_hours, "saving_vs_unit": c.saving_vs_unit,
                            "saving_vs_static": c.saving_vs_static, "elastic_gpus": list(c.elastic_gpus),
                            "unit_gpus": list(c.unit_gpus), "demand_gpus": list(c.demand_gpus)})
    return 0


def _write_json(args: argparse.Namespace, schema: str, data: dict[str, object]) -> None:
    """``data`` with its schema name and the flags that made it, when ``--json`` was given."""
    if args.json:
        from tokenomy.metrics.report import finite_or_none, write_json

        settings = {k: v for k, v in vars(args).items() if k not in ("func", "json", "command", "eaas_command")}
        write_json(args.json, finite_or_none({"schema": schema, "settings": settings, **data}))
