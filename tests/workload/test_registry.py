"""load_workload on traces and bad specs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tokenomy.workload import GAIA, agent_sessions, load_workload, write_sessions

from .shared_data import AZURE_CONV, MOONCAKE_CONV, require
from .test_mooncake import ROWS


@pytest.fixture
def mooncake_file(tmp_path: Path) -> Path:
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_jsonl_detected_as_mooncake_or_session_file(tmp_path: Path, mooncake_file: Path) -> None:
    mc = load_workload(str(mooncake_file), rate_per_s=0, duration_s=math.inf)
    assert len(mc) == 6 and all(len(s.turns) == 1 for s in mc)
    assert len(load_workload(f"mooncake-sessions:{mooncake_file}", rate_per_s=0, duration_s=math.inf)) == 4
    assert len(load_workload(str(mooncake_file), rate_per_s=0, duration_s=math.inf, sessionize=True)) == 4
    ours = tmp_path / "ours.jsonl"
    sessions = agent_sessions(GAIA, np.array([0.0, 1.0]), np.random.default_rng(0))
    write_sessions(ours, sessions)
    assert load_workload(str(ours), rate_per_s=0, duration_s=math.inf) == sessions


def test_trace_rate_rescales_and_duration_cuts(mooncake_file: Path) -> None:
    native = load_workload(str(mooncake_file), rate_per_s=0, duration_s=math.inf, seed=1)
    span = native[-1].start_s - native[0].start_s
    fast = load_workload(str(mooncake_file), rate_per_s=10 * 5 / span, duration_s=math.inf, seed=1)
    assert [s.start_s for s in fast] == pytest.approx([s.start_s / 10 for s in native])
    assert load_workload(str(mooncake_file), rate_per_s=0, duration_s=4.0, seed=1) == [
        s for s in native if s.start_s < 4.0
    ]
    assert len(load_workload(str(mooncake_file), rate_per_s=0, duration_s=math.inf, max_sessions=2)) == 2


def test_sessionized_think_times_scale_with_the_timeline(mooncake_file: Path) -> None:
    spec = f"mooncake-sessions:{mooncake_file}"
    native = load_workload(spec, rate_per_s=0, duration_s=math.inf)
    span = native[-1].start_s - native[0].start_s
    slow = load_workload(spec, rate_per_s=(len(native) - 1) / span / 2, duration_s=math.inf)
    conv_native = next(s for s in native if s.session_id == "mooncake-0")
    conv_slow = next(s for s in slow if s.session_id == "mooncake-0")
    assert conv_slow.start_s == pytest.approx(2 * conv_native.start_s)
    assert [t.think_time_s for t in conv_slow.turns] == pytest.approx(
        [2 * t.think_time_s for t in conv_native.turns]
    )


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ("swebench", {}, "unknown workload 'swebench'; choices: chat, coding-agent, gaia, toolbench, or a file"),
        ("trace.parquet", {}, "unknown workload"),
        ("missing.jsonl", {}, "not found"),
        ("chat", {"arrival": "uniform"}, "known: gamma, poisson"),
        ("chat", {"rate_per_s": 0.0}, "needs a finite rate > 0"),
        ("chat", {"max_sessions": 0}, "max_sessions"),
    ],
)
def test_bad_specs_fail_clearly(spec: str, kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"rate_per_s": 1.0, "duration_s": 10.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        load_workload(spec, **args)  # type: ignore[arg-type]


def test_unrecognised_jsonl_and_sessionize_misuse(tmp_path: Path) -> None:
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"prompt": "hi"}\n')
    with pytest.raises(ValueError, match="neither a session file.*nor a Mooncake trace"):
        load_workload(str(odd), rate_per_s=0, duration_s=10.0)
    csv = tmp_path / "a.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3,4\n")
    with pytest.raises(ValueError, match="sessionize applies to Mooncake traces; this file is read as azure"):
        load_workload(str(csv), rate_per_s=0, duration_s=10.0, sessionize=True)


@pytest.mark.parametrize("path", [MOONCAKE_CONV, AZURE_CONV], ids=["mooncake", "azure"])
def test_real_traces_at_a_chosen_rate(path: Path) -> None:
    sessions = load_workload(str(require(path)), rate_per_s=5.0, duration_s=200.0, seed=3)
    assert 0.6 * 1000 < len(sessions) < 1.4 * 1000
    assert [s.start_s for s in sessions] == sorted(s.start_s for s in sessions)
    assert len({s.session_id for s in sessions}) == len(sessions)
