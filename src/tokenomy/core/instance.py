"""Instances and their roles."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    """What an engine instance does: both phases, prefill only, or decode only."""

    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One engine instance: a model on ``tp`` GPUs of one kind, in one role."""

    instance_id: str
    role: Role
    model: str
    gpu: str
    tp: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
