"""`tokenomy bench` end to end over real HTTP against a loopback fake server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import main
from tokenomy.workload import write_sessions

from .factories import agent_sessions
from .fakes import FakeEngine, serve_loopback

SIM_KEYS = {"ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "e2e_p99_s",
            "slo_attainment", "goodput_rps", "rpm", "tpm", "cost_per_mtok_usd", "mfu", "tokens"}


@pytest.mark.integration
def test_bench_writes_sim_shaped_json_and_a_plot(tmp_path: Path) -> None:
    out, plot, trace = tmp_path / "b.json", tmp_path / "b.png", tmp_path / "w.jsonl"
    write_sessions(trace, agent_sessions(4, turns=3, think_s=0.01, gap_s=0.0))
    engine = FakeEngine(fail={3: 503})
    with serve_loopback(engine) as url:
        rc = main(["bench", "--target", url, "--workload", str(trace), "--concurrency", "2",
                   "--duration", "60", "--json", str(out), "--plot", str(plot), "--quiet"])
    assert rc == 0
    payload = json.loads(out.read_text())
    sim_out = tmp_path / "s.json"
    assert main(["sim", "--workload", str(trace), "--rate", "0", "--instances", "1",
                 "--deployment", "colocated", "--json", str(sim_out), "--quiet"]) == 0
    sim_payload = json.loads(sim_out.read_text())
    assert set(payload) >= set(sim_payload)  # same top-level shape as `tokenomy sim --json`
    d = payload["deployments"]["bench"]
    assert set(d) >= SIM_KEYS | set(sim_payload["deployments"]["colocated"]) - {"sim_end_s"}
    assert d["errors_by_status"] == {"503": 1}
    assert d["retries"] == 1 and d["requests"] == len(engine.bodies) - 1  # the 503 was sent again (one request)
    assert payload["bench"]["model"] == "fake-model"  # discovered from /v1/models
    assert d["tokens"]["cache_hit_tokens"] > 0 and 0 < d["cached_fraction"] < 1
    assert plot.stat().st_size > 1000


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--target", "localhost:1", "--model", "m"],
        ["bench", "--target", "http://127.0.0.1:9", "--model", "m", "--concurrency", "0"],
        ["bench", "--target", "http://127.0.0.1:9", "--model", "m", "--concurrency", "2", "--rate", "1"],
        ["bench", "--target", "http://127.0.0.1:9", "--model", "m", "--workload", "nope"],
        ["bench", "--target", "http://127.0.0.1:9", "--model", "m", "--duration", "0"],
        ["bench", "--target", "http://127.0.0.1:9"],  # no --model and nothing answers /v1/models
    ],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0]


def test_unreachable_target_is_reported_as_connect_errors(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    rc = main(["bench", "--target", "http://127.0.0.1:9", "--model", "m", "--workload", "chat",
               "--rate", "5", "--duration", "2", "--json", str(out), "--quiet"])
    assert rc == 0
    d = json.loads(out.read_text())["deployments"]["bench"]
    assert set(d["errors_by_status"]) == {"connect_error"} and d["slo_attainment"] == 0.0
