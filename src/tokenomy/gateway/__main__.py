"""``python -m tokenomy.gateway --config gateway.yaml``: ``tokenomy serve`` without loading the other
commands (no torch import: the gateway starts in about a second)."""

from __future__ import annotations

import argparse
import sys

from tokenomy.cli.serve_cmd import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenomy.gateway")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:
        print(f"tokenomy serve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
