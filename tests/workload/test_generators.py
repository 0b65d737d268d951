"""Synthetic chat and agent sessions: turn invariants, determinism, documented means."""

from __future__ import annotations

import numpy as np
import pytest

from tokenomy.core import Session
from tokenomy.core.request import content_tokens
from tokenomy.workload import (
    AGENT_PROFILES,
    CHAT,
    GAIA,
    TOOLBENCH,
    AgentProfile,
    LogNormal,
    agent_sessions,
    chat_sessions,
    get_profile,
    load_workload,
)


def _agents(profile: AgentProfile, n: int = 400, seed: int = 0) -> list[Session]:
    return agent_sessions(profile, np.linspace(0.0, 100.0, n), np.random.default_rng(seed))


def _stream_length(turn_content: tuple[tuple[int, int], ...], key: int) -> int:
    return sum(n for k, n in turn_content if k == key)


@pytest.mark.parametrize("profile", [GAIA, TOOLBENCH], ids=lambda p: p.name)
def test_agent_turn_invariants(profile: AgentProfile) -> None:
    sys_keys = set()
    for s in _agents(profile, n=100):
        first = s.turns[0]
        assert first.history_tokens == 0
        assert first.content[0] == (first.content[0][0], profile.system_prompt_tokens)
        sys_keys.add(first.content[0][0])
        session_key = first.content[1][0]
        for prev, cur in zip(s.turns, s.turns[1:], strict=False):
            # content covers prompt and output, and turn k+1 re-reads all of turn k
            assert content_tokens(cur.content) == cur.prompt_tokens + cur.output_tokens
            assert cur.content[0] == prev.content[0]
            assert _stream_length(cur.content, session_key) > _stream_length(prev.content, session_key)
            assert cur.history_tokens == prev.prompt_tokens + prev.output_tokens
            assert cur.history_tokens > prev.history_tokens
            assert cur.new_tokens >= profile.tool_result_tokens.low
            assert cur.prompt_tokens + cur.output_tokens <= profile.max_context_tokens
            assert profile.think_time_s.low <= cur.think_time_s <= profile.think_time_s.high
    assert len(sys_keys) == 1  # one shared system/tool prompt stream per workload


def test_sessions_have_distinct_streams_and_ids() -> None:
    sessions = _agents(TOOLBENCH, n=50)
    keys = {s.turns[0].content[1][0] for s in sessions}
    assert len(keys) == len(sessions) == len({s.session_id for s in sessions})


@pytest.mark.parametrize("profile", [GAIA, TOOLBENCH], ids=lambda p: p.name)
def test_agent_presets_match_documented_means(profile: AgentProfile) -> None:
    sessions = _agents(profile, n=3000, seed=3)
    turns = np.array([len(s.turns) for s in sessions])
    tool = np.array([t.new_tokens for s in sessions for t in s.turns[1:]])
    outs = np.array([t.output_tokens for s in sessions for t in s.turns])
    think = np.array([t.think_time_s for s in sessions for t in s.turns[1:]])
    for sample, dist in [
        (turns, profile.turns),
        (tool, profile.tool_result_tokens),
        (outs, profile.output_tokens),
        (think, profile.think_time_s),
    ]:
        assert abs(sample.mean() - dist.expected()) / dist.expected() < 0.06
    # documented shape (docs/workloads.md): GAIA ~12 calls with ~3k-token tool results,
    # ToolBench ~4.7 calls (3.7 API calls + final answer) with ~400-token JSON results.
    expected = {"gaia": (12.0, 3000.0, 8.0), "toolbench": (4.7, 400.0, 1.2)}[profile.name]
    assert turns.mean() == pytest.approx(expected[0], rel=0.06)
    assert tool.mean() == pytest.approx(expected[1], rel=0.08)
    assert think.mean() == pytest.approx(expected[2], rel=0.1)


def test_gaia_contexts_are_much_longer_than_toolbench() -> None:
    def last_context(s: Session) -> int:
        return s.turns[-1].prompt_tokens

    gaia = np.median([last_context(s) for s in _agents(GAIA)])
    tb = np.median([last_context(s) for s in _agents(TOOLBENCH)])
    assert gaia > 4 * tb


def test_context_cap_ends_sessions_early() -> None:
    tight = AgentProfile(
        name="tight",
        turns=LogNormal(20.0, 0.0, 20, 20),
        system_prompt_tokens=100,
        first_user_tokens=LogNormal(100.0, 0.0, 100, 100),
        tool_result_tokens=LogNormal(1000.0, 0.0, 1000, 1000),
        output_tokens=LogNormal(100.0, 0.0, 100, 100),
        think_time_s=LogNormal(1.0, 0.0, 1.0, 1.0),
        max_context_tokens=5000,
    )
    (s,) = agent_sessions(tight, np.zeros(1), np.random.default_rng(0))
    # turn k's prompt+output = 100 + 200 + 1100 * k; k = 4 reaches 4700, k = 5 would be 5800
    assert len(s.turns) == 5


def test_chat_is_single_turn_behind_shared_system_prompt() -> None:
    sessions = chat_sessions(np.arange(2000.0), np.random.default_rng(4))
    assert all(len(s.turns) == 1 and s.turns[0].history_tokens == 0 for s in sessions)
    assert len({s.turns[0].content[0] for s in sessions}) == 1
    prompts = np.array([s.turns[0].prompt_tokens for s in sessions])
    outs = np.array([s.turns[0].output_tokens for s in sessions])
    expected_prompt = CHAT.system_prompt_tokens + CHAT.user_tokens.expected()
    assert abs(prompts.mean() - expected_prompt) / expected_prompt < 0.08
    assert abs(outs.mean() - CHAT.output_tokens.expected()) / CHAT.output_tokens.expected() < 0.08


@pytest.mark.parametrize("spec", ["chat", "gaia", "toolbench"])
def test_load_workload_is_deterministic_sorted_unique(spec: str) -> None:
    a = load_workload(spec, rate_per_s=1.0, duration_s=60.0, seed=5)
    b = load_workload(spec, rate_per_s=1.0, duration_s=60.0, seed=5)
    c = load_workload(spec, rate_per_s=1.0, duration_s=60.0, seed=6)
    assert a == b and a != c
    starts = [s.start_s for s in a]
    assert starts == sorted(starts) and starts[-1] < 60.0
    assert len({s.session_id for s in a}) == len(a)


def test_load_workload_rate_and_cap() -> None:
    sessions = load_workload("chat", rate_per_s=20.0, duration_s=500.0, arrival="gamma", arrival_cv=2.0)
    assert abs(len(sessions) / 500.0 - 20.0) / 20.0 < 0.1
    assert len(load_workload("gaia", rate_per_s=20.0, duration_s=500.0, max_sessions=7)) == 7


def test_unknown_profile_lists_known() -> None:
    with pytest.raises(ValueError, match="known: gaia, toolbench"):
        get_profile("swebench")
    assert set(AGENT_PROFILES) == {"gaia", "toolbench"}


def test_lognormal_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="mean"):
        LogNormal(0.0, 1.0, 0, 10)
    with pytest.raises(ValueError, match="low <= high"):
        LogNormal(5.0, 1.0, 10, 1)
