"""Decision traces: every policy decision can be written out as one flat, JSON-ready event.

A *trace sink* is any callable taking one event mapping (an engine ``EventTrace``'s append,
a JSONL writer, ``list.append`` in a test). Policies never write files themselves: they hand
``{"kind": ..., "t_s": now, **decision.to_dict()}`` to the sink they were given, or do
nothing when they have none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import fields
from enum import Enum
from typing import Any, Protocol

TraceSink = Callable[[Mapping[str, Any]], None]


class Traceable(Protocol):
    """A decision that can describe itself as flat JSON-ready fields (one of them ``reason``)."""

    def to_dict(self) -> dict[str, Any]: ...


def json_value(value: Any) -> Any:
    """``value`` made JSON-safe: enums by value, infinities as None, tuples as lists."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple | list):
        return [json_value(v) for v in value]
    return value


def emit(sink: TraceSink | None, kind: str, now: float, decision: Traceable) -> None:
    """Hand ``decision`` to ``sink`` as one event of ``kind`` at ``now``; no-op without a sink."""
    if sink is not None:
        sink({"kind": kind, "t_s": now, **decision.to_dict()})


def fields_dict(decision: Any) -> dict[str, Any]:
    """A dataclass decision's fields as a JSON-ready dict (see :func:`json_value`)."""
    return {f.name: json_value(getattr(decision, f.name)) for f in fields(decision)}
