"""The `tokenomy sim` and `tokenomy sim compare` commands, end to end in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import main

MOONCAKE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "mooncake" / "conversation_trace.jsonl"
METRIC_KEYS = {
    "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "slo_attainment", "goodput_rps", "cost_per_mtok_usd", "mfu", "tokens",
}


def test_sim_writes_the_documented_json_for_both_deployments(tmp_path: Path) -> None:
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["sim", "--workload", "toolbench", "--rate", "1", "--duration", "10", "--instances", "2",
               "--deployment", "colocated,disagg", "--json", str(out), "--plot", str(plot), "--quiet"])
    assert rc == 0
    payload = json.loads(out.read_text())
    assert set(payload["deployments"]) == {"colocated", "disagg"}
    for d in payload["deployments"].values():
        assert set(d) >= METRIC_KEYS
        assert d["tokens"]["cache_hit_tokens"] + d["tokens"]["recomputed_tokens"] == d["tokens"]["prompt_tokens"]
        assert 0 <= d["slo_attainment"] <= 1
    assert plot.stat().st_size > 1000


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "--workload", "nope", "--quiet"],
        ["sim", "--workload", "chat", "--deployment", "nope", "--duration", "5", "--quiet"],
        ["sim", "--workload", "chat", "--rate", "-1", "--quiet"],
        ["sim", "compare", "--workload", "chat", "--rates", "a,b"],
        ["sim", "compare", "--workload", "chat", "--rates", "1", "--deployments", "ampd@0:2"],
        ["sim", "compare", "--workload", "chat", "--rates", "1", "--deployments", "ampd", "--splits", "2-6"],
    ],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0]


def test_compare_sweeps_rates_and_reports_goodput(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    rc = main(["sim", "compare", "--workload", "toolbench", "--duration", "10", "--instances", "2",
               "--deployments", "colocated,ampd", "--rates", "0.5,1", "--workers", "1", "--json", str(out)])
    assert rc == 0
    payload = json.loads(out.read_text())
    assert payload["rates"] == [0.5, 1.0]
    for d in payload["deployments"].values():
        assert len(d["slo_attainment"]) == 2 and d["max_rate_at_target_rps"] >= 0
        assert payload["spec"]["rates"] == [0.5, 1.0]
    assert payload["deployments"]["ampd"]["split"] == {"prefill": 1, "decode": 1}


def test_compare_reports_the_best_of_the_listed_splits(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    rc = main(["sim", "compare", "--workload", "toolbench", "--duration", "8", "--instances", "3",
               "--deployments", "disagg", "--rates", "1", "--splits", "1:2,2:1", "--workers", "1", "--json", str(out)])
    assert rc == 0
    split = json.loads(out.read_text())["deployments"]["disagg"]["split"]
    assert (split["prefill"], split["decode"]) in {(1, 2), (2, 1)}


@pytest.mark.skipif(not MOONCAKE.exists(), reason="shared Mooncake trace not present (../shared/data)")
def test_sessionised_mooncake_trace_runs_through_compare(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    rc = main(["sim", "compare", "--workload", f"mooncake-sessions:{MOONCAKE}", "--max-sessions", "60",
               "--duration", "1e9", "--deployments", "colocated,ampd", "--rates", "0.5", "--workers", "1",
               "--json", str(out)])
    assert rc == 0
    payload = json.loads(out.read_text())
    assert set(payload["deployments"]) == {"colocated", "ampd"}
