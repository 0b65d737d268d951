"""``tokenomy demo``: the whole system live on the embedded defaults (no GPU, no external service);
``tokenomy demo --sim``: the simulator's comparison of colocated, PD-disaggregated and AMPD serving."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from tokenomy.cli import sim_cmd
from tokenomy.cli.common import CLIError, OneLineParser


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the live stack: emulated P/D cluster, AMPD gateway, two tenants, "
                                    "a runaway agent (--sim: the simulator comparison)", description=__doc__)
    p.add_argument("--sim", action="store_true", help="compare colocated, disagg and AMPD in the simulator instead")
    p.add_argument("--short", action="store_true", help="a run of about half a minute (fewer, faster sessions)")
    p.add_argument("--duration", type=float, default=None, help="seconds of session arrivals (default 60; short 8)")
    p.add_argument("--rate", type=float, default=None, help="sessions per second per tenant (default 0.25)")
    p.add_argument("--time-scale", type=float, default=None,
                   help="engines' wall seconds per modelled second (default 1; short 0.25)")
    p.add_argument("--out", type=Path, default=Path("out/demo"),
                   help="folder for the gateway's config, ledger and logs (replaced each run)")
    p.add_argument("--keep", action="store_true", help="keep the stack running after the report, until Ctrl-C")
    p.add_argument("--json", default="out/demo.json", help="--sim: results JSON")
    p.add_argument("--plot", default="out/demo.png", help="--sim: plot")
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    if args.sim:
        return run_sim_demo(args)
    from rich.console import Console

    from tokenomy.demo import DemoSettings, run_live_demo

    settings = DemoSettings.short() if args.short else DemoSettings()
    flags = {"duration_s": ("--duration", args.duration), "rate_per_s": ("--rate", args.rate),
             "time_scale": ("--time-scale", args.time_scale)}
    changes = {name: value for name, (_, value) in flags.items() if value is not None}
    for name, value in changes.items():
        if not value > 0:
            raise CLIError(f"{flags[name][0]} must be positive, got {value:g}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # piped or logged: the bill tables' width, not rich's 80
    from tokenomy.emulator.launcher import LaunchError

    try:
        return run_live_demo(dataclasses.replace(settings, **changes), args.out, console, keep=args.keep)
    except LaunchError as exc:  # e.g. no free ports: one line, never a traceback
        raise CLIError(str(exc)) from None


def run_sim_demo(args: argparse.Namespace) -> int:
    parser = OneLineParser(prog="tokenomy")
    sim_cmd.register(parser.add_subparsers(dest="command", required=True))
    sim_args = parser.parse_args(
        [
            "sim",
            "--workload", "gaia",
            "--deployment", "colocated,disagg,ampd",
            "--rate", "1.0",
            "--duration", "120",
            "--json", str(args.json),
            "--plot", str(args.plot),
        ]
    )
    return int(sim_args.func(sim_args) or 0)
