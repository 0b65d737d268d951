"""``--html FILE`` of ``tokenomy sim``, ``sim compare``, ``bench`` and ``plan``: one file that opens
offline (nothing fetched from the network, plotly.js inlined, tags balanced) and holds the same
numbers the command wrote as JSON, in its tables and in its plots' data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.factories import agent_sessions
from bench.fakes import FakeEngine, serve_loopback
from helpers.html_check import assert_self_contained, read_report
from tokenomy.cli.main import main
from tokenomy.workload import write_sessions


def _ms(v: float) -> str:
    return f"{v * 1e3:.1f}"


def test_sim_html_holds_the_table_and_the_latency_and_token_plots(tmp_path: Path) -> None:
    out, page = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["sim", "--workload", "toolbench", "--rate", "1", "--duration", "10", "--instances", "2",
                 "--deployment", "colocated,disagg", "--json", str(out), "--html", str(page), "--quiet"]) == 0
    report = read_report(page)
    assert_self_contained(report)
    deps = json.loads(out.read_text())["deployments"]
    for name, d in deps.items():
        assert name in report.cells
        assert _ms(d["ttft_p99_s"]) in report.cells and f"{d['tokens']['input_tokens']:,}" in report.cells
    lat = report.figure("Latency percentiles")
    ttft = {t["name"]: t["y"] for t in lat["data"] if t["yaxis"] == "y"}
    assert ttft["colocated"][2] == pytest.approx(deps["colocated"]["ttft_p99_s"] * 1e3, abs=1e-3)
    tokens = report.figure("Token classes")
    hits = next(t for t in tokens["data"] if t["name"] == "cache hit")
    assert hits["y"] == [deps[n]["tokens"]["cache_hit_tokens"] for n in ("colocated", "disagg")]


def test_sim_compare_html_plots_attainment_against_rate(tmp_path: Path) -> None:
    out, page = tmp_path / "c.json", tmp_path / "c.html"
    assert main(["sim", "compare", "--workload", "chat", "--rates", "1,4", "--duration", "8", "--instances", "2",
                 "--deployments", "colocated", "--workers", "1", "--json", str(out), "--html", str(page),
                 "--quiet"]) == 0
    report = read_report(page)
    assert_self_contained(report)
    curve = json.loads(out.read_text())["deployments"]["colocated"]
    fig = report.figure("SLO attainment vs session rate")
    line = next(t for t in fig["data"] if t["name"] == "colocated")
    assert line["x"] == [1.0, 4.0]
    assert line["y"] == pytest.approx(curve["slo_attainment"])
    assert f"{curve['slo_attainment'][0]:.1%}" in report.cells
    assert report.figure("P99 TTFT vs session rate")["data"][0]["y"][1] == pytest.approx(
        curve["ttft_p99_s"][1] * 1e3, abs=1e-3)


def test_plan_html_holds_the_topology_and_per_node_predictions(tmp_path: Path) -> None:
    plan_json, page = tmp_path / "p.json", tmp_path / "p.html"
    assert main(["plan", "--workload", "chat", "--rate", "4", "--duration", "30", "--gpus", "h100:4",
                 "--json", str(plan_json), "--html", str(page)]) == 0
    report = read_report(page)
    assert_self_contained(report)
    text = page.read_text()
    assert "topology:" in text and "binding:" in text
    assert {"node", "instances", "GPUs", "util", "TTFT P95", "TPOT P95"} <= set(report.cells)
    util = report.figure("Predicted utilisation")["data"][0]["y"]
    assert util and all(0 <= u <= 1 for u in util)
    assert f"{util[0]:.0%}" in report.cells


@pytest.mark.integration
def test_bench_html_holds_per_session_cost(tmp_path: Path) -> None:
    trace, out, page = tmp_path / "w.jsonl", tmp_path / "b.json", tmp_path / "b.html"
    write_sessions(trace, agent_sessions(3, turns=3, think_s=0.01, gap_s=0.0))
    with serve_loopback(FakeEngine()) as url:
        assert main(["bench", "--target", url, "--workload", str(trace), "--concurrency", "3", "--duration", "60",
                     "--json", str(out), "--html", str(page), "--quiet"]) == 0
    report = read_report(page)
    assert_self_contained(report)
    d = json.loads(out.read_text())["deployments"]["bench"]
    assert _ms(d["ttft_p50_s"]) in report.cells
    cost = report.figure("Cost per session")
    assert sorted(cost["data"][0]["x"]) == ["s0", "s1", "s2"]
    # Priced at the gateway's default prices: recomputed input $0.20, cached $0.05, output $0.60 per Mtok.
    total = sum(sum(t["y"]) for t in cost["data"])
    expected = (d["tokens"]["recomputed_tokens"] * 0.20 + d["tokens"]["cache_hit_tokens"] * 0.05
                + d["tokens"]["output_tokens"] * 0.60) / 1e6
    assert total == pytest.approx(expected, rel=1e-6)
