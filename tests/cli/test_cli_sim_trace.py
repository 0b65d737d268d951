"""`tokenomy sim --trace-events FILE`: a run explained after the fact."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tokenomy.cli.main import main

ARGS = ["sim", "--workload", "toolbench", "--rate", "1", "--duration", "10", "--instances", "2", "--quiet"]


def test_trace_events_explain_every_finished_request(tmp_path: Path) -> None:
    out, trace = tmp_path / "r.json", tmp_path / "events.jsonl"
    rc = main([*ARGS, "--deployment", "colocated,disagg", "--json", str(out), "--trace-events", str(trace)])
    assert rc == 0
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    runs = [i for i, e in enumerate(events) if e["kind"] == "run"]
    assert [events[i]["deployment"] for i in runs] == ["colocated", "disagg"]
    colocated = events[runs[0] + 1 : runs[1]]
    kinds = Counter(e["kind"] for e in colocated)
    assert kinds["queued"] == kinds["finish"] and kinds["admit"] >= kinds["queued"] and kinds["step"] > 0
    assert len({e["instance"] for e in colocated}) == 2
    summary = json.loads(out.read_text())["deployments"]["colocated"]
    assert summary["tokens"]["output_tokens"] == sum(e["output_tokens"] for e in colocated if e["kind"] == "finish")
    for instance in {e["instance"] for e in colocated}:
        steps = [e["t_s"] for e in colocated if e["instance"] == instance and e["kind"] == "step"]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)  # one batch at a time
    admitted = {e["request"]: e["t_s"] for e in colocated if e["kind"] == "admit"}
    assert all(e["t_s"] > admitted[e["request"]] for e in colocated if e["kind"] == "finish")


def test_an_unwritable_trace_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--deployment", "colocated", "--trace-events", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace-events" in err[0]
