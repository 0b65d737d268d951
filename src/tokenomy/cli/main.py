"""The ``tokenomy`` command: thin argument parsing; each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from tokenomy.cli.common import CLIError, OneLineParser

# Each module exposes ``register(subparsers)`` and sets ``func`` on its parsers.
COMMAND_MODULES = (
    "perf_cmd", "sim_cmd", "eaas_cmd", "demo_cmd", "emulate_cmd", "up_cmd", "bench_cmd",
    "serve_cmd", "usage_cmd", "keys_cmd", "tenants_cmd", "plan_cmd", "model_cmd",
)


def _version() -> str:
    try:
        return version("tokenomy")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="tokenomy", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tokenomy {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"tokenomy.cli.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed on one line
        return exc.code if isinstance(exc.code, int) else 2
    try:
        rc = args.func(args)
    except (CLIError, ValueError, KeyError, OSError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        text = " ".join(str(msg).split()) or type(exc).__name__  # one line, whatever the message held
        sub = [v for k, v in sorted(vars(args).items()) if k.endswith("_command") and isinstance(v, str)]
        print(f"tokenomy {' '.join([args.command, *sub])}: error: {text}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
