"""Synthetic multi-turn agent runs (ReAct loop: generate -> call tool -> read result -> generate).

Turn 0 sends the shared system + tool-description prompt and the user's task; every later
turn appends one tool result to the session's context and re-reads everything before it
(history). ``think_time_s`` between turns is the tool's latency. The two presets are
shaped like GAIA and ToolBench runs; docs/workloads.md gives every number's source or
says it is our assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenomy.core import Session
from tokenomy.workload.build import grow_turns
from tokenomy.workload.dists import LogNormal
from tokenomy.workload.keys import StreamKeys


@dataclass(frozen=True, slots=True)
class AgentProfile:
    """Shape of one kind of agent run; token counts per LLM call, times in seconds.

    - ``turns``: LLM calls per session (>= 1); the last one produces the final answer.
    - ``system_prompt_tokens``: system prompt plus tool descriptions, shared by all sessions.
    - ``first_user_tokens``: the task message of turn 0.
    - ``tool_result_tokens``: tokens a tool result appends before turns 1, 2, ...
    - ``output_tokens``: tokens generated per call (reasoning + tool call, or the answer).
    - ``think_time_s``: tool latency between an answer and the next call.
    - ``max_context_tokens``: a run stops before a call whose prompt + output would exceed it.
    """

    name: str
    turns: LogNormal
    system_prompt_tokens: int
    first_user_tokens: LogNormal
    tool_result_tokens: LogNormal
    output_tokens: LogNormal
    think_time_s: LogNormal
    max_context_tokens: int

    def __post_init__(self) -> None:
        if self.turns.low < 1:
            raise ValueError(f"{self.name}: turns.low must be >= 1")
        for field_name in ("first_user_tokens", "tool_result_tokens", "output_tokens"):
            if getattr(self, field_name).low < 1:
                raise ValueError(f"{self.name}: {field_name}.low must be >= 1")
        if self.system_prompt_tokens < 0:
            raise ValueError(f"{self.name}: system_prompt_tokens must be >= 0")
        first_max = self.system_prompt_tokens + self.first_user_tokens.high + self.output_tokens.high
        if first_max > self.max_context_tokens:
            raise ValueError(
                f"{self.name}: max_context_tokens={self.max_context_tokens} is below the largest "
                f"first turn ({first_max:.0f} tokens)"
            )


GAIA = AgentProfile(
    name="gaia",
    turns=LogNormal(mean=12.0, cv=0.6, low=3, high=40),
    system_prompt_tokens=2500,
    first_user_tokens=LogNormal(mean=400.0, cv=0.8, low=30, high=4000),
    tool_result_tokens=LogNormal(mean=3000.0, cv=1.0, low=50, high=20_000),
    output_tokens=LogNormal(mean=400.0, cv=0.8, low=10, high=4000),
    think_time_s=LogNormal(mean=8.0, cv=1.2, low=0.5, high=120.0),
    max_context_tokens=131_072,
)

TOOLBENCH = AgentProfile(
    name="toolbench",
    turns=LogNormal(mean=4.7, cv=0.35, low=2, high=10),
    system_prompt_tokens=3000,
    first_user_tokens=LogNormal(mean=120.0, cv=0.5, low=20, high=600),
    tool_result_tokens=LogNormal(mean=400.0, cv=0.8, low=20, high=2048),
    output_tokens=LogNormal(mean=150.0, cv=0.6, low=10, high=1024),
    think_time_s=LogNormal(mean=1.2, cv=0.6, low=0.2, high=5.0),
    max_context_tokens=32_768,
)

AGENT_PROFILES: dict[str, AgentProfile] = {p.name: p for p in (GAIA, TOOLBENCH)}


def get_profile(name: str) -> AgentProfile:
    """The preset registered under ``name``; unknown names list the known ones."""
    try:
        return AGENT_PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(AGENT_PROFILES))
        raise ValueError(f"unknown agent profile {name!r}; known: {known}") from None


def agent_sessions(
    profile: AgentProfile,
    start_times_s: np.ndarray,
    rng: np.random.Generator,
    keys: StreamKeys | None = None,
    id_prefix: str | None = None,
) -> list[Session]:
    """One agent run per start time, ids ``f"{id_prefix or profile.name}-{i}"``, in input order.

    All sessions share one system-prompt stream; each has its own growing stream, so turn
    k+1's content extends turn k's prompt and output (see :mod:`tokenomy.workload.build`).
    """
    keys = keys or StreamKeys()
    prefix = id_prefix or profile.name
    sys_key = keys.new()
    n_turns = profile.turns.sample_int(rng, len(start_times_s))
    sessions: list[Session] = []
    for i, (start, n) in enumerate(zip(start_times_s, n_turns, strict=True)):
        new = profile.tool_result_tokens.sample_int(rng, int(n))
        new[0] = profile.first_user_tokens.sample_int(rng, 1)[0]
        turns = grow_turns(
            sys_key,
            profile.system_prompt_tokens,
            keys.new(),
            new.tolist(),
            profile.output_tokens.sample_int(rng, int(n)).tolist(),
            profile.think_time_s.sample(rng, int(n)).tolist(),
            max_context_tokens=profile.max_context_tokens,
        )
        sessions.append(Session(session_id=f"{prefix}-{i}", start_s=float(start), turns=turns))
    return sessions
