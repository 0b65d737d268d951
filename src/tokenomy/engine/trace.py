"""An optional event trace of what an engine did, so a run can be explained after the fact.

An engine given a trace reports each of these as one flat dict (schema in ``docs/simulator.md``,
"Event trace"): ``queued`` (a request was added), ``admit`` (it got KV and started computing,
again after a preemption), ``preempt`` (its KV was dropped to make room), ``evict`` (cached free
blocks were overwritten), ``step`` (one iteration's batch), ``finish`` and ``abort``. Every event
has ``t_s``, the time the engine was given (the simulator's virtual clock or the emulator's wall
clock; the engine never reads a clock), ``kind`` and ``instance``: the same two leading keys as
``policy`` decision events, so one :class:`JsonlTrace` can take both (its ``emit`` is a sink).

Without a trace (the default) the engine does no tracing work at all: it keeps ``None`` and tests
it once per call. :class:`NoTrace` is the explicit no-op; :class:`JsonlTrace` writes one JSON
object per line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

TraceEvent = Mapping[str, Any]
"""One event: ``t_s``, ``kind``, ``instance``, then the kind's fields."""


class EventTrace(Protocol):
    """Where an engine's events go. ``emit`` is called in the order the engine applies them."""

    def emit(self, event: TraceEvent) -> None: ...


class NoTrace:
    """Drops every event; an engine given one traces nothing (same as no trace)."""

    def emit(self, event: TraceEvent) -> None:
        return None


class ListTrace:
    """Keeps the events in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []

    def emit(self, event: TraceEvent) -> None:
        self.events.append(event)


class JsonlTrace:
    """Writes each event as one compact JSON line to ``path`` (truncated on open), or to an open
    text stream the caller owns. Use as a context manager, or call :meth:`close`."""

    def __init__(self, path: str | Path | IO[str]) -> None:
        if isinstance(path, str | Path):
            self._out: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
            self._owned = True
        else:
            self._out = path
            self._owned = False
        self._dumps = json.JSONEncoder(separators=(",", ":")).encode
        self.num_events = 0

    def emit(self, event: TraceEvent) -> None:
        self._out.write(self._dumps(event))
        self._out.write("\n")
        self.num_events += 1

    def close(self) -> None:
        """Flush, and close the file if this trace opened it. Idempotent."""
        if self._out.closed:
            return
        self._out.flush()
        if self._owned:
            self._out.close()

    def __enter__(self) -> JsonlTrace:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def active(trace: EventTrace | None) -> EventTrace | None:
    """The trace an engine should call, or None when tracing is off (no trace, or :class:`NoTrace`)."""
    return None if trace is None or isinstance(trace, NoTrace) else trace
