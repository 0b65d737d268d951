"""KV retention across tool calls: keep on GPU, offload to host, or drop and recompute.

Formulas (docs/ampd.md, "KV retention"), for a session holding ``kv_tokens`` of KV:

* ``swap_s = 2 * kv_tokens * kv_bytes_per_token / pcie_bytes_per_s`` (copy out, copy back);
* ``recompute_s = estimator.prefill_time_s(kv_tokens, 0)`` (prefill the history again);
* pressure: ``kv_usage >= critical_usage`` is critical, ``>= high_usage`` is high.

``decide`` applies, first match wins:

1. critical pressure -> DROP (frees at once, no PCIe traffic while memory is short);
2. no high pressure and ``expected_tool_latency_s <= keep_max_tool_s`` -> KEEP, pinned with
   ``ttl_s = ttl_factor * expected_tool_latency_s`` (Continuum's TTL pinning);
3. ``swap_s < recompute_s`` -> OFFLOAD, kept on host for ``ttl_s = host_ttl_factor * expected tool time``;
4. otherwise DROP (recompute is cheaper: InferCept's discard).

``under_pressure`` frees memory when usage is high: it walks retained sessions longest expected
remaining tool time first (they hold memory longest for nothing; ties: more KV first, then id)
and offloads or drops each (rules 1, 3, 4) until usage would fall to ``relief_target_usage``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tokenomy.policy.estimator import Estimator
from tokenomy.policy.trace import TraceSink, emit, fields_dict


class Retention(Enum):
    KEEP = "keep"
    OFFLOAD = "offload"
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class RetentionDecision:
    """What to do with one session's KV while its tool runs; ``ttl_s`` is how long to hold it
    (on GPU for KEEP, on host for OFFLOAD, 0 for DROP). ``session_id`` names the session."""

    action: Retention
    ttl_s: float
    reason: str
    session_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, for the decision trace."""
        return fields_dict(self)


@dataclass(frozen=True, slots=True)
class RetainedKV:
    """A session whose KV sits on the GPU during a tool call expected to return at ``expected_resume_s``."""

    session_id: str
    kv_tokens: int
    expected_resume_s: float


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """Thresholds of KV retention (all our choices; the whitepaper gives none).

    ``high_usage`` / ``critical_usage``: KV usage fractions that mean pressure / emergency.
    ``keep_max_tool_s``: longest expected tool call worth pinning KV for (5 s).
    ``ttl_factor`` / ``host_ttl_factor``: TTL as a multiple of the expected tool time, so a
    slightly late tool still finds its KV. ``relief_target_usage``: usage ``under_pressure`` frees down to.
    """

    high_usage: float = 0.8
    critical_usage: float = 0.95
    keep_max_tool_s: float = 5.0
    ttl_factor: float = 1.5
    host_ttl_factor: float = 3.0
    relief_target_usage: float = 0.7

    def __post_init__(self) -> None:
        if not 0.0 < self.relief_target_usage <= self.high_usage <= self.critical_usage <= 1.0:
            raise ValueError(
                "need 0 < relief_target_usage <= high_usage <= critical_usage <= 1, got "
                f"{self.relief_target_usage}, {self.high_usage}, {self.critical_usage}"
            )
        if self.keep_max_tool_s < 0 or self.ttl_factor < 1.0 or self.host_ttl_factor < 1.0:
            raise ValueError("keep_max_tool_s must be >= 0 and TTL factors >= 1")


class KVRetentionPolicy:
    """Per-session KV retention decisions during tool calls (module docstring)."""

    def __init__(
        self, config: RetentionConfig, estimator: Estimator, pcie_bytes_per_s: float, *, trace: TraceSink | None = None
    ) -> None:
        if not pcie_bytes_per_s > 0:
            raise ValueError(f"pcie_bytes_per_s must be > 0, got {pcie_bytes_per_s}")
        self.config = config
        self.estimator = estimator
        self.pcie_bytes_per_s = pcie_bytes_per_s
        self.trace = trace

    def swap_time_s(self, kv_tokens: int) -> float:
        """Offload plus reload time of ``kv_tokens`` of KV over PCIe."""
        return 2.0 * kv_tokens * self.estimator.kv_bytes_per_token / self.pcie_bytes_per_s

    def recompute_time_s(self, kv_tokens: int) -> float:
        return self.estimator.prefill_time_s(kv_tokens, 0) if kv_tokens > 0 else 0.0

    def decide(
        self, *, session_id: str, kv_tokens: int, expected_tool_latency_s: float, kv_usage: float, now: float
    ) -> RetentionDecision:
        """Retention of one session's KV as its tool call starts (also handed to the trace sink)."""
        decision = self._decide(session_id, kv_tokens, expected_tool_latency_s, kv_usage)
        emit(self.trace, "retention", now, decision)
        return decision

    def _decide(self, session_id: str, kv_tokens: int, expected_tool_latency_s: float, kv_usage: float) -> RetentionDecision:
        if kv_tokens < 0 or expected_tool_latency_s < 0:
            raise ValueError("kv_tokens and expected_tool_latency_s must be >= 0")
        if not 0.0 <= kv_usage <= 1.0:
            raise ValueError(f"kv_usage must be in [0, 1], got {kv_usage}")
        cfg = self.config
        if kv_usage >= cfg.critical_usage:
            return RetentionDecision(Retention.DROP, 0.0, "critical KV pressure", session_id)
        if kv_usage < cfg.high_usage and expected_tool_latency_s <= cfg.keep_max_tool_s:
            ttl = cfg.ttl_factor * expected_tool_latency_s
            return RetentionDecision(Retention.KEEP, ttl, "short tool, no KV pressure", session_id)
        return self._free(session_id, kv_tokens, expected_tool_latency_s)

    def on_expiry(
        self, *, session_id: str, kv_tokens: int, expected_tool_latency_s: float, now: float = 0.0
    ) -> RetentionDecision:
        """A KEEP pin outlived its TTL (the tool is late): offload if swapping beats recompute, else drop."""
        if kv_tokens < 0 or expected_tool_latency_s < 0:
            raise ValueError("kv_tokens and expected_tool_latency_s must be >= 0")
        decision = self._free(session_id, kv_tokens, expected_tool_latency_s)
        emit(self.trace, "retention", now, decision)
        return decision

    def _free(self, session_id: str, kv_tokens: int, tool_s: float) -> RetentionDecision:
        swap, recompute = self.swap_time_s(kv_tokens), self.recompute_time_s(kv_tokens)
        if swap < recompute:
            why = f"swap {swap:.3g}s < recompute {recompute:.3g}s"
            return RetentionDecision(Retention.OFFLOAD, self.config.host_ttl_factor * tool_s, why, session_id)
        why = f"recompute {recompute:.3g}s <= swap {swap:.3g}s"
        return RetentionDecision(Retention.DROP, 0.0, why, session_id)

    def eviction_order(self, retained: Sequence[RetainedKV], now: float) -> list[RetainedKV]:
        """Retained sessions, first to evict first: longest expected remaining tool time, more KV, id."""
        return sorted(retained, key=lambda r: (-(r.expected_resume_s - now), -r.kv_tokens, r.session_id))

    def under_pressure_at(self, kv_usage: float) -> bool:
        """Whether :meth:`under_pressure` would free anything at this usage (``>= high_usage``): a
        caller may skip building the retained list below it."""
        return kv_usage >= self.config.high_usage

    def under_pressure(
        self, retained: Sequence[RetainedKV], *, kv_usage: float, capacity_tokens: int, now: float
    ) -> list[RetentionDecision]:
        """OFFLOAD/DROP decisions that bring usage down to ``relief_target_usage``; [] below ``high_usage``.

        ``capacity_tokens`` is the instance's KV capacity in tokens (``total_blocks * block_size``).
        If freeing every retained session is not enough, all of them are freed.
        """
        if capacity_tokens < 1:
            raise ValueError(f"capacity_tokens must be >= 1, got {capacity_tokens}")
        if not 0.0 <= kv_usage <= 1.0:
            raise ValueError(f"kv_usage must be in [0, 1], got {kv_usage}")
        cfg = self.config
        if not self.under_pressure_at(kv_usage):
            return []
        critical = kv_usage >= cfg.critical_usage
        # whole tokens, so that float noise in the fractions cannot evict one session too many
        to_free = round(kv_usage * capacity_tokens) - round(cfg.relief_target_usage * capacity_tokens)
        decisions: list[RetentionDecision] = []
        for r in self.eviction_order(retained, now):
            if to_free <= 0:
                break
            tool_s = max(0.0, r.expected_resume_s - now)
            if critical:
                decisions.append(RetentionDecision(Retention.DROP, 0.0, "critical KV pressure", r.session_id))
            else:
                decisions.append(self._free(r.session_id, r.kv_tokens, tool_s))
            to_free -= r.kv_tokens
        for d in decisions:
            emit(self.trace, "retention", now, d)
        return decisions
