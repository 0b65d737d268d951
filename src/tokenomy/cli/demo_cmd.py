"""Placeholder: this subcommand group is being written."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # pragma: no cover - replaced soon
    del sub
