"""The busy window: idle think time between closed-loop turns does not dilute rates and costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import main
from tokenomy.core import RequestRecord, TokenUsage
from tokenomy.metrics.window import busy_window_s, span_s


def _rec(arrival: float, finish: float | None) -> RequestRecord:
    return RequestRecord(request_id=f"r{arrival}", arrival_s=arrival, first_token_s=finish, finish_s=finish,
                         prompt_tokens=10, output_tokens=2, usage=TokenUsage(), finished=finish is not None)


@pytest.mark.parametrize(
    ("intervals", "busy", "span"),
    [
        ([], 0.0, 0.0),
        ([(0, 2)], 2.0, 2.0),
        ([(0, 2), (1, 3)], 3.0, 3.0),  # overlap counted once
        ([(0, 2), (3600, 3601)], 3.0, 3601.0),  # an hour of idle think time left out
        ([(0, 2), (1, None)], 10.0, 10.0),  # unfinished: in the system until end_s = 10
    ],
)
def test_busy_window_and_span(intervals: list[tuple[float, float | None]], busy: float, span: float) -> None:
    recs = [_rec(a, f) for a, f in intervals]
    assert busy_window_s(recs, end_s=10.0) == pytest.approx(busy)
    assert span_s(recs, end_s=10.0) == pytest.approx(span)


def test_an_agent_that_thinks_for_an_hour_keeps_sensible_rates(tmp_path: Path) -> None:
    path, out = tmp_path / "agent.jsonl", tmp_path / "r.json"
    rows = [{"session_id": "a", "turn": 0, "arrival_s": 0.0, "input_tokens": 500, "output_tokens": 50},
            {"session_id": "a", "turn": 1, "think_time_s": 3600.0, "input_tokens": 700, "output_tokens": 50,
             "history_tokens": 550}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["sim", "--workload", str(path), "--deployment", "colocated", "--instances", "1", "--quiet",
                 "--json", str(out)]) == 0
    d = json.loads(out.read_text())["deployments"]["colocated"]
    assert d["span_s"] > 3600 and d["duration_s"] < 5
    assert d["goodput_rps"] == pytest.approx(2 / d["duration_s"])
    assert d["cost_usd"] < 0.01  # a few busy seconds of one GPU, not an hour
