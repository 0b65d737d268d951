"""``tokenomy sim compare``: placeholder until the rate sweep lands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    del sub
