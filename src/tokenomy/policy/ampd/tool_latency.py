"""Tool-latency estimation: how long a session's tool call is expected to take.

A tool call is the gap between a session's answer and its next turn's arrival. The estimator
observes those gaps (``on_turn_end`` then ``on_arrival`` of the same session) and reports their
running mean; before any gap has been seen it reports ``prior_s`` (a labelled default: no
source gives one). Retention decisions (keep / offload / drop) and their TTLs are priced from it.

It is given ``now`` by its caller and keeps at most ``max_sessions`` open tool calls (oldest
forgotten first), so a long-running gateway does not grow without bound.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tokenomy.policy.trace import TraceSink, emit, fields_dict


@dataclass(frozen=True, slots=True)
class ToolLatencyConfig:
    """``prior_s``: expected tool time before any is observed (our default, 5 s).
    ``max_sessions``: open tool calls remembered at once (LRU beyond it)."""

    prior_s: float = 5.0
    max_sessions: int = 100_000

    def __post_init__(self) -> None:
        if self.prior_s < 0:
            raise ValueError(f"prior_s must be >= 0, got {self.prior_s}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")


@dataclass(frozen=True, slots=True)
class ToolLatencyEstimate:
    """The expected tool time, how many observed gaps it rests on, and why."""

    expected_s: float
    samples: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, for the decision trace."""
        return fields_dict(self)


class ToolLatencyEstimator:
    """Running mean of observed tool-call gaps (module docstring)."""

    def __init__(self, config: ToolLatencyConfig, *, trace: TraceSink | None = None) -> None:
        self.config = config
        self.trace = trace
        self._open: OrderedDict[str, float] = OrderedDict()
        self._sum_s = 0.0
        self._n = 0

    def on_turn_end(self, session_id: str, now: float) -> None:
        """The session's answer finished at ``now``: its tool call starts."""
        if not session_id:
            return
        self._open[session_id] = now
        self._open.move_to_end(session_id)
        while len(self._open) > self.config.max_sessions:
            self._open.popitem(last=False)

    def on_arrival(self, session_id: str, now: float) -> None:
        """The session's next turn arrived at ``now``: the gap since its answer is one observation."""
        end = self._open.pop(session_id, None)
        if end is not None and now >= end:
            self._sum_s += now - end
            self._n += 1

    def estimate(self, now: float) -> ToolLatencyEstimate:
        """The current estimate; it goes to the trace sink (callers ask once per decision that uses it)."""
        if self._n == 0:
            est = ToolLatencyEstimate(self.config.prior_s, 0, "no tool call observed yet: prior")
        else:
            est = ToolLatencyEstimate(self._sum_s / self._n, self._n, "mean of observed tool calls")
        emit(self.trace, "tool_latency", now, est)
        return est
