"""Flags of one expert server, kept free of torch so ``tokenomy --help`` starts fast."""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenomy.eaas.config import PRESETS

__doc_server__ = "Run one stateless expert server (see tokenomy.eaas.server)."


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="python -m tokenomy.eaas.server", description=__doc_server__)
    p.add_argument("--bind", default="tcp://127.0.0.1:0", help="tcp://host:port (0 = free port) or ipc://path")
    p.add_argument("--experts", default=None,
                   help="expert ids to host, e.g. 0-7 or 0,3,5 (required unless --expert-file; then default: all)")
    p.add_argument("--preset", default="deepseek-tiny", help=f"model shape: {', '.join(sorted(PRESETS))}")
    p.add_argument("--seed", type=int, default=0, help="weights seed (ignored with --weights)")
    p.add_argument("--weights", type=Path, default=None, help="local safetensors file with the block's weights")
    p.add_argument("--expert-file", type=Path, default=None,
                   help="a model's expert checkpoint (tokenomy.eaas.checkpoint); --preset/--seed/--weights ignored")
    p.add_argument("--server-id", default=None, help="name shown in stats (default: from the pid)")
    return p
