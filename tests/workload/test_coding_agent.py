"""The coding-agent workload: long shared histories, short outputs, heavy-tailed gaps, compaction."""

from __future__ import annotations

import numpy as np

from tokenomy.workload import load_workload
from tokenomy.workload.coding_agent import CODING_AGENT


def sessions(seed: int = 0, duration_s: float = 120):  # type: ignore[no-untyped-def]
    return load_workload("coding-agent", rate_per_s=1, duration_s=duration_s, seed=seed)


def test_each_turn_extends_the_previous_one_unless_the_agent_compacted() -> None:
    compactions = 0
    for s in sessions():
        for prev, cur in zip(s.turns, s.turns[1:], strict=False):
            (sys_prev, body_prev), (sys_cur, body_cur) = prev.content, cur.content
            assert sys_prev == sys_cur  # the system prompt and tool schemas are always shared
            if body_cur[0] == body_prev[0]:  # same history stream: all of prev's prompt and answer is reused
                assert cur.history_tokens == prev.prompt_tokens + prev.output_tokens
            else:  # compaction: the rewritten history shares nothing but the system prompt
                compactions += 1
                assert cur.history_tokens == CODING_AGENT.system_prompt_tokens
                assert prev.prompt_tokens + prev.output_tokens + 100 > 0.5 * CODING_AGENT.compact_at_tokens
            assert cur.prompt_tokens + cur.output_tokens <= CODING_AGENT.compact_at_tokens
    assert compactions > 0


def test_published_shape_tens_of_turns_long_histories_short_outputs_heavy_tails() -> None:
    ss = sessions()
    turns = [t for s in ss for t in s.turns]
    later = [t for s in ss for t in s.turns[1:]]
    assert 15 <= np.mean([len(s.turns) for s in ss]) <= 45
    prompts = np.array([t.prompt_tokens for t in turns])
    assert 50_000 <= np.median(prompts) <= 100_000 and np.percentile(prompts, 90) > 90_000
    assert np.median([t.history_tokens / t.prompt_tokens for t in later]) > 0.95
    assert np.mean([t.output_tokens for t in turns]) < 500
    gaps = np.array([t.think_time_s for t in later])
    assert np.percentile(gaps, 50) < 3 and np.percentile(gaps, 90) > 10 * np.percentile(gaps, 50)


def test_deterministic_under_a_seed() -> None:
    assert sessions(3, 20) == sessions(3, 20) and sessions(3, 20) != sessions(4, 20)
