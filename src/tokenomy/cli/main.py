"""The ``tokenomy`` command: thin argument parsing; each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module exposes ``register(subparsers)`` and sets ``func`` on its parsers.
COMMAND_MODULES = ("perf_cmd", "sim_cmd", "eaas_cmd", "demo_cmd", "plan_cmd")


class CLIError(Exception):
    """A user error: printed as one line, exit status 2, never a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenomy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"tokenomy.cli.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except (CLIError, ValueError, KeyError, FileNotFoundError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"tokenomy {args.command}: error: {msg}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
