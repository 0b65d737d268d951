"""Long-context coding-agent sessions (``--workload coding-agent``): Claude Code / Codex-like loops.

A session is one agent working in a repository: turn 0 sends the shared system prompt and tool
schemas, the task and the first files read; every later turn appends one tool result (a file,
a diff, test output) to the whole history, so nearly all of each prompt is the previous turn's
prompt and answer. Outputs are short (a tool call or an edit). Between turns the agent waits on
its tool or on the human: heavy-tailed. When the context would pass ``compact_at_tokens`` the
agent compacts: the history is rewritten into a summary, the prefix is lost (only the system
prompt is still shared), and the session continues from the summary.

Every number is in :data:`CODING_AGENT` with its source in docs/workloads.md (TraceLab's
4,265 Claude Code / Codex sessions, arXiv 2606.30560, and its public atlas) or labelled there
as our default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenomy.core import Session
from tokenomy.workload.build import Compaction, grow_turns
from tokenomy.workload.dists import LogNormal
from tokenomy.workload.keys import StreamKeys


@dataclass(frozen=True, slots=True)
class CodingAgentProfile:
    """Shape of coding-agent sessions; token counts per LLM call, times in seconds.

    - ``turns``: LLM calls (agent steps) per session.
    - ``system_prompt_tokens``: system prompt and tool schemas, shared by every session.
    - ``first_context_tokens``: turn 0's own input (task and the first files read).
    - ``tool_result_tokens``: what one tool result appends before turns 1, 2, ...
    - ``output_tokens``: tokens generated per call.
    - ``think_time_s``: the gap between an answer and the next call (tool or human).
    - ``compact_at_tokens``: a call whose prompt + output would pass this is made after a
      compaction instead: its prompt is the system prompt, a summary and its tool result.
    - ``summary_tokens``: the summary a compaction leaves.
    """

    name: str
    turns: LogNormal
    system_prompt_tokens: int
    first_context_tokens: LogNormal
    tool_result_tokens: LogNormal
    output_tokens: LogNormal
    think_time_s: LogNormal
    compact_at_tokens: int
    summary_tokens: LogNormal

    def __post_init__(self) -> None:
        if self.turns.low < 1:
            raise ValueError(f"{self.name}: turns.low must be >= 1")
        largest_restart = (self.system_prompt_tokens + self.summary_tokens.high + self.tool_result_tokens.high
                           + self.output_tokens.high)
        largest_first = self.system_prompt_tokens + self.first_context_tokens.high + self.output_tokens.high
        if max(largest_restart, largest_first) > self.compact_at_tokens:
            raise ValueError(f"{self.name}: compact_at_tokens={self.compact_at_tokens} is below the largest "
                             f"first or post-compaction turn ({max(largest_restart, largest_first):.0f} tokens)")


# Sources and our defaults: docs/workloads.md, "coding-agent".
CODING_AGENT = CodingAgentProfile(
    name="coding-agent",
    turns=LogNormal(mean=30.0, cv=0.8, low=8, high=120),
    system_prompt_tokens=12_000,
    first_context_tokens=LogNormal(mean=40_000.0, cv=0.4, low=10_000, high=90_000),
    tool_result_tokens=LogNormal(mean=2_500.0, cv=1.5, low=50, high=25_000),
    output_tokens=LogNormal(mean=300.0, cv=1.0, low=10, high=2_000),
    think_time_s=LogNormal(mean=45.0, cv=28.0, low=0.05, high=900.0),
    compact_at_tokens=120_000,
    summary_tokens=LogNormal(mean=15_000.0, cv=0.4, low=4_000, high=30_000),
)


def coding_agent_sessions(
    start_times_s: np.ndarray,
    rng: np.random.Generator,
    keys: StreamKeys | None = None,
    profile: CodingAgentProfile = CODING_AGENT,
    id_prefix: str | None = None,
) -> list[Session]:
    """One coding session per start time, ids ``f"{id_prefix or profile.name}-{i}"``, in input order.

    The turns are :func:`~tokenomy.workload.build.grow_turns`' (the agent workloads' layout)
    with a :class:`~tokenomy.workload.build.Compaction`: a new stream and a sampled summary."""
    keys = keys or StreamKeys()
    prefix = id_prefix or profile.name
    sys_key = keys.new()
    n_turns = profile.turns.sample_int(rng, len(start_times_s))

    def restart() -> tuple[int, int]:
        return keys.new(), int(profile.summary_tokens.sample_int(rng, 1)[0])

    compaction = Compaction(profile.compact_at_tokens, restart)
    sessions = []
    for i, (start, n) in enumerate(zip(start_times_s, n_turns, strict=True)):
        n = int(n)
        new = profile.tool_result_tokens.sample_int(rng, n)
        new[0] = profile.first_context_tokens.sample_int(rng, 1)[0]
        outs = profile.output_tokens.sample_int(rng, n)
        thinks = profile.think_time_s.sample(rng, n)
        turns = grow_turns(sys_key, profile.system_prompt_tokens, keys.new(), new.tolist(), outs.tolist(),
                           thinks.tolist(), compaction=compaction)
        sessions.append(Session(session_id=f"{prefix}-{i}", start_s=float(start), turns=turns))
    return sessions
