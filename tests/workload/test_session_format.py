"""Tokenomy session format: exact round trip, Mooncake-style hashes, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenomy.core import Session, Turn
from tokenomy.workload import GAIA, agent_sessions, read_mooncake, read_sessions, write_sessions

from .test_mooncake import ROWS


def test_round_trip_is_exact(tmp_path: Path) -> None:
    sessions = agent_sessions(GAIA, np.array([0.0, 0.123456789, 7.5]), np.random.default_rng(0))
    sessions.append(
        Session("vip", 3.25, (Turn(10, 5, think_time_s=0.5), Turn(20, 1, 15, 2.0)), tenant="acme", priority=3)
    )
    path = tmp_path / "s.jsonl"
    assert write_sessions(path, sessions) == sum(len(s.turns) for s in sessions)
    assert read_sessions(path) == sessions


def test_round_trip_of_sessionized_mooncake(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    sessions = read_mooncake(trace, sessionize=True, jitter_s=3.0)
    path = tmp_path / "s.jsonl"
    write_sessions(path, sessions)
    assert read_sessions(path) == sessions


def test_prefix_hashes_become_block_streams(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    lines = [
        {"session_id": "a", "turn": 0, "arrival_s": 1.0, "input_tokens": 1200, "output_tokens": 8,
         "prefix_hashes": [5, 6, 7], "hash_block_tokens": 512},
        {"session_id": "b", "turn": 0, "arrival_s": 2.0, "input_tokens": 600, "output_tokens": 4,
         "prefix_hashes": [5, 9], "hash_block_tokens": 512, "tenant": "t1"},
        {"session_id": "a", "turn": 1, "think_time_s": 3.0, "input_tokens": 1300, "output_tokens": 2,
         "history_tokens": 1200},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    a, b = read_sessions(path)
    assert a.turns[0].content == ((5, 512), (6, 512), (7, 176), (10, 8))  # output key above all keys
    assert b.turns[0].content == ((5, 512), (9, 88), (11, 4))
    assert (b.tenant, a.turns[1].history_tokens, a.turns[1].think_time_s) == ("t1", 1200, 3.0)


BASE = {"session_id": "s", "turn": 0, "arrival_s": 0.0, "input_tokens": 10, "output_tokens": 2}


@pytest.mark.parametrize(
    ("second_line", "message"),
    [
        ("{oops", "s.jsonl:2: invalid JSON"),
        ({"session_id": "s", "turn": 1, "input_tokens": 10, "output_tokens": 2}, "2: missing field.*think_time_s"),
        ({"session_id": "t", "turn": 0, "input_tokens": 10, "output_tokens": 2}, "2: missing field.*arrival_s"),
        ({**BASE, "session_id": "t", "output_tokens": -1}, "2: output_tokens must be an integer >= 1"),
        ({**BASE, "session_id": "t", "input_tokens": 0}, "2: input_tokens must be an integer >= 1"),
        ({**BASE, "session_id": "t", "arrival_s": -2}, "2: arrival_s must be a finite number >= 0"),
        ({**BASE, "session_id": "t", "history_tokens": 11}, "2: history_tokens 11 exceeds"),
        ({**BASE, "turn": 2, "think_time_s": 1.0}, "2: session 's' turn 2 out of order \\(expected turn 1\\)"),
        ({**BASE}, "2: session 's' turn 0 out of order"),
        ({**BASE, "session_id": "t", "content": [[1, 3]]}, "2: content covers fewer tokens"),
        ({**BASE, "session_id": "t", "content": [["x", 3]]}, "2: content must be a list"),
        ({**BASE, "session_id": "t", "prefix_hashes": [1]}, "2: prefix_hashes and hash_block_tokens"),
        ({**BASE, "session_id": "t", "prefix_hashes": [1, 2], "hash_block_tokens": 512}, "2: 2 prefix_hashes"),
        ({"session_id": "s", "turn": 1, "think_time_s": 1, "input_tokens": 9, "output_tokens": 1,
          "tenant": "x", "priority": 1}, None),
    ],
)  # fmt: skip
def test_malformed_lines_name_the_line(tmp_path: Path, second_line: object, message: str | None) -> None:
    path = tmp_path / "s.jsonl"
    second = second_line if isinstance(second_line, str) else json.dumps(second_line)
    path.write_text(json.dumps({**BASE, "tenant": "x"}) + "\n" + second + "\n")
    if message is None:
        (s,) = read_sessions(path)
        assert (s.tenant, s.priority, len(s.turns)) == ("x", 1, 2)
        return
    with pytest.raises(ValueError, match=message):
        read_sessions(path)


def test_conflicting_tenant_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    second = {
        "session_id": "s",
        "turn": 1,
        "think_time_s": 1,
        "input_tokens": 9,
        "output_tokens": 1,
        "tenant": "y",
    }
    path.write_text(json.dumps({**BASE, "tenant": "x"}) + "\n" + json.dumps(second) + "\n")
    with pytest.raises(ValueError, match="s.jsonl:2: tenant differs"):
        read_sessions(path)


def test_tenant_fields_round_trip_and_must_agree_across_a_tenants_sessions(tmp_path: Path) -> None:
    turn = (Turn(prompt_tokens=10, output_tokens=2),)
    sessions = [Session("a", 0.0, turn, tenant="acme", tier="gold", budget_tokens=5000, rate_limit_tokens_per_s=50.0),
                Session("b", 1.0, turn, tenant="acme", tier="gold", budget_tokens=5000, rate_limit_tokens_per_s=50.0),
                Session("c", 2.0, turn, tenant="bob", tier="free")]
    path = tmp_path / "s.jsonl"
    write_sessions(path, sessions)
    assert read_sessions(path) == sessions
    bad = path.read_text().replace('"tier":"gold","budget_tokens":5000', '"tier":"silver","budget_tokens":5000', 1)
    path.write_text(bad)
    with pytest.raises(ValueError, match="tenant 'acme': tier is 'silver' in session 'a' but 'gold' in session 'b'"):
        read_sessions(path)
    path.write_text('{"session_id":"x","turn":0,"arrival_s":0,"input_tokens":5,"output_tokens":1,"budget_tokens":0}\n')
    with pytest.raises(ValueError, match=r"s.jsonl:1: budget_tokens must be an integer >= 1"):
        read_sessions(path)
