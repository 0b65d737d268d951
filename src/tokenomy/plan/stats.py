"""What the planner needs to know about a workload: per-request samples, not means.

A :class:`WorkloadStats` is built from sessions (a sample of the workload at the target rate)
and keeps, for every request, the tokens a prefill instance must compute, the tokens it
finds cached, the prompt, the output, and the session's tool-parked KV. The planner prices
every sample through the perf model, so percentiles of latency come from the distribution
(long prompts, long contexts) rather than from the mean request, which mis-sizes capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenomy.core import Session

MAX_SAMPLES = 2000
"""Requests kept (evenly strided) so that pricing every sample stays fast."""


@dataclass(frozen=True)
class WorkloadStats:
    """Per-request samples of one workload and its steady-state rates.

    Arrays are aligned (one entry per sampled request). ``cached_disagg_tokens`` is the prompt
    prefix a disaggregated prefill instance can hold from the session's previous turn (its
    prompt; the previous answer was decoded elsewhere); ``cached_mixed_tokens`` the prefix a
    colocated instance can hold (the whole history). ``parked_kv_tokens`` is, by Little's law,
    the mean number of KV tokens of sessions waiting on a tool (or a user) at any moment.
    """

    name: str
    session_rate_per_s: float
    request_rate_per_s: float
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    cached_disagg_tokens: np.ndarray
    cached_mixed_tokens: np.ndarray
    parked_kv_tokens: float

    def percentile(self, field: str, q: float) -> float:
        """Percentile ``q`` (0-100) of one of the per-request arrays, e.g. ``("prompt_tokens", 95)``."""
        return float(np.percentile(getattr(self, field), q))

    def scaled(self, factor: float) -> WorkloadStats:
        """The same request shapes at ``factor`` times the rate (parked KV scales with it)."""
        if not factor > 0:
            raise ValueError(f"rate factor must be > 0, got {factor}")
        return WorkloadStats(
            self.name, self.session_rate_per_s * factor, self.request_rate_per_s * factor,
            self.prompt_tokens, self.output_tokens, self.cached_disagg_tokens, self.cached_mixed_tokens,
            self.parked_kv_tokens * factor,
        )


def workload_stats(name: str, sessions: Sequence[Session], session_rate_per_s: float) -> WorkloadStats:
    """Stats of ``sessions`` arriving at ``session_rate_per_s``.

    The steady-state request rate is ``session_rate_per_s`` times the mean turns per session
    (every turn is one request), which a short simulation of long agent sessions only
    reaches after the first sessions have ended. Raises ``ValueError`` on an empty sample or
    a non-positive rate.
    """
    if not sessions:
        raise ValueError(f"workload {name!r} gave no sessions to plan for")
    if not session_rate_per_s > 0:
        raise ValueError(f"session rate must be > 0, got {session_rate_per_s}")
    prompt, output, cached_d, cached_m = [], [], [], []
    parked_per_session = []
    for s in sessions:
        parked = 0.0
        prev_prompt = 0
        for k, t in enumerate(s.turns):
            prompt.append(t.prompt_tokens)
            output.append(t.output_tokens)
            cached_m.append(t.history_tokens)
            cached_d.append(min(prev_prompt, t.history_tokens))
            if k > 0:  # the session waited think_time_s holding its history before this turn
                parked += t.think_time_s * t.history_tokens
            prev_prompt = t.prompt_tokens
        parked_per_session.append(parked)
    n_turns = len(prompt) / len(sessions)
    idx = np.linspace(0, len(prompt) - 1, min(len(prompt), MAX_SAMPLES)).astype(int)

    def arr(v: list[int]) -> np.ndarray:
        return np.asarray(v, dtype=np.int64)[idx]

    return WorkloadStats(
        name=name,
        session_rate_per_s=session_rate_per_s,
        request_rate_per_s=session_rate_per_s * n_turns,
        prompt_tokens=arr(prompt),
        output_tokens=arr(output),
        cached_disagg_tokens=arr(cached_d),
        cached_mixed_tokens=arr(cached_m),
        parked_kv_tokens=session_rate_per_s * float(np.mean(parked_per_session)),
    )
