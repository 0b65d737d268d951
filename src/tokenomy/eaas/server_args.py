"""Command-line options of an expert server, importable without torch (``tokenomy --help`` needs them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenomy.eaas.config import PRESETS


def add_server_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options ``tokenomy.eaas.server.run_from_args`` reads; returns ``p``."""
    p.add_argument("--bind", default="tcp://127.0.0.1:0", help="tcp://host:port (0 = free port) or ipc://path")
    p.add_argument("--experts", required=True, help="expert ids to host, e.g. 0-7 or 0,3,5")
    p.add_argument("--preset", default="deepseek-tiny", help=f"model shape: {', '.join(sorted(PRESETS))}")
    p.add_argument("--seed", type=int, default=0, help="weights seed (ignored with --weights)")
    p.add_argument("--weights", type=Path, default=None, help="local safetensors file with the block's weights")
    p.add_argument("--server-id", default=None, help="name shown in stats (default: from the pid)")
    return p
