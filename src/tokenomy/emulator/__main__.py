"""``python -m tokenomy.emulator``: ``tokenomy emulate`` without loading the other commands.

``tokenomy up`` starts its instances this way: each process imports only the emulator.
"""

from __future__ import annotations

import argparse
import sys

from tokenomy.cli import emulate_cmd
from tokenomy.cli.common import CLIError


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenomy.emulator")
    sub = parser.add_subparsers(dest="command", required=True)
    emulate_cmd.register(sub)
    args = parser.parse_args(["emulate", *sys.argv[1:]])
    try:
        return int(args.func(args) or 0)
    except (CLIError, ValueError, KeyError, FileNotFoundError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"tokenomy emulate: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
