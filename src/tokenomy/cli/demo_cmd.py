"""``tokenomy demo``: the main job on the embedded defaults, no GPU, no external service."""

from __future__ import annotations

import argparse

from tokenomy.cli.main import build_parser


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="compare colocated, PD-disaggregated and AMPD serving of an agent workload")
    p.add_argument("--json", default="out/demo.json")
    p.add_argument("--plot", default="out/demo.png")
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    sim_args = build_parser().parse_args(
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
