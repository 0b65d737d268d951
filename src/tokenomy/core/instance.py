"""The roles an engine instance can play."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """What an engine instance does: both phases, prefill only, or decode only."""

    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"
