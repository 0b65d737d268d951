"""Mooncake reader: content from hash ids, sessionisation, validation, the real trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenomy.workload import read_mooncake, read_mooncake_requests

from .shared_data import MOONCAKE_CONV, require

# r2 continues r0 (contains all of r0's full blocks) and r5 continues r2; r1 only shares
# the system-prompt block 0; r3 extends r0 a second time (a fork); r4 shares two blocks.
ROWS = [
    {"timestamp": 0, "input_length": 1600, "output_length": 20, "hash_ids": [0, 1, 2, 3]},
    {"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [0, 9]},
    {"timestamp": 4000, "input_length": 2100, "output_length": 30, "hash_ids": [0, 1, 2, 4, 5]},
    {"timestamp": 6000, "input_length": 1700, "output_length": 7, "hash_ids": [0, 1, 2, 6]},
    {"timestamp": 9000, "input_length": 1100, "output_length": 9, "hash_ids": [0, 1, 7]},
    {"timestamp": 9500, "input_length": 2600, "output_length": 9, "hash_ids": [0, 1, 2, 4, 8, 10]},
]


def _write(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_one_session_per_request_with_block_content(tmp_path: Path) -> None:
    sessions = read_mooncake(_write(tmp_path, ROWS))
    assert [s.start_s for s in sessions] == [0.0, 1.0, 4.0, 6.0, 9.0, 9.5]
    t0, t2 = sessions[0].turns[0], sessions[2].turns[0]
    assert (t0.prompt_tokens, t0.output_tokens, t0.history_tokens) == (1600, 20, 0)
    assert [n for _, n in t0.content] == [512, 512, 512, 64, 20]
    # shared blocks are the same streams, so a prefix cache sees r0's three full blocks reused
    assert t2.content[:3] == t0.content[:3] and t2.content[3] != t0.content[3]
    # outputs are fresh streams, distinct from every block stream
    out_keys = {s.turns[0].content[-1][0] for s in sessions}
    block_keys = {k for s in sessions for k, _ in s.turns[0].content[:-1]}
    assert len(out_keys) == 6 and not out_keys & block_keys


def test_sessionize_links_extensions_only(tmp_path: Path) -> None:
    sessions = read_mooncake(_write(tmp_path, ROWS), sessionize=True)
    by_id = {s.session_id: s for s in sessions}
    assert sorted(by_id) == ["mooncake-0", "mooncake-1", "mooncake-3", "mooncake-4"]
    conv = by_id["mooncake-0"]
    assert [t.prompt_tokens for t in conv.turns] == [1600, 2100, 2600]
    assert [t.history_tokens for t in conv.turns] == [0, 3 * 512, 4 * 512]  # shared block prefix
    # think time is the arrival gap to the previous turn (documented approximation)
    assert [t.think_time_s for t in conv.turns[1:]] == pytest.approx([4.0, 5.5])
    assert len(by_id["mooncake-3"].turns) == 1  # a second extension of r0 forks a new session
    assert len(by_id["mooncake-4"].turns) == 1  # it shares only 2 blocks with anyone
    assert [s.start_s for s in sessions] == sorted(s.start_s for s in sessions)


def test_limit_time_scale_and_jitter(tmp_path: Path) -> None:
    path = _write(tmp_path, ROWS)
    assert len(read_mooncake(path, limit=2)) == 2
    assert [s.start_s for s in read_mooncake(path, time_scale=0.5)][-1] == 4.75
    jittered = read_mooncake(path, jitter_s=3.0, rng=np.random.default_rng(1))
    raw = {f"mooncake-{i}": t for i, t in enumerate([0, 1, 4, 6, 9, 9.5])}
    assert all(0.0 <= s.start_s - raw[s.session_id] < 3.0 for s in jittered)
    assert [s.start_s for s in jittered] == sorted(s.start_s for s in jittered)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "trace.jsonl:2: invalid JSON"),
        ('{"timestamp": 0, "input_length": 10}', "trace.jsonl:2: missing field"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "input_length"),
        ('{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [0]}', "timestamp"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}', "expected ceil"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}', "hash_ids"),
    ],
)
def test_malformed_lines_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message):
        read_mooncake_requests(path)


def test_real_conversation_trace() -> None:
    path = require(MOONCAKE_CONV)
    sessions = read_mooncake(path, jitter_s=3.0)
    assert len(sessions) == 12031
    assert all(r.hash_ids[0] == 0 for r in read_mooncake_requests(path))
    first_blocks = {s.turns[0].content[0][0] for s in sessions}
    assert len(first_blocks) == 1  # so every session's content starts with the same stream


def test_real_trace_sessionized_finds_multi_turn_sessions() -> None:
    sessions = read_mooncake(require(MOONCAKE_CONV), sessionize=True)
    assert sum(len(s.turns) for s in sessions) == 12031
    multi = [s for s in sessions if len(s.turns) > 1]
    later_turns = sum(len(s.turns) - 1 for s in multi)
    # the data README: about a third of requests extend an earlier request's prefix
    assert 0.25 < later_turns / 12031 < 0.40  # we link 3.5k of 12k (29%)
    assert all(t.history_tokens > 0 for s in multi for t in s.turns[1:])
    gaps = [t.think_time_s for s in multi for t in s.turns[1:]]
    assert 60.0 < float(np.median(gaps)) < 250.0  # README: median gap ~125 s
