"""A plan saved with ``tokenomy plan --out`` runs in ``tokenomy sim --plan`` as planned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tokenomy.cli.main import main
from tokenomy.core import SLO
from tokenomy.plan.planfile import deployment_label, sim_overrides
from tokenomy.sim import SimConfig, simulate
from tokenomy.workload.registry import load_workload


def test_plan_out_then_sim_plan_runs_that_topology(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    rc = main(["plan", "--workload", "chat", "--rate", "4", "--duration", "30", "--gpus", "h100:4",
               "--mode", "disagg", "--out", str(out)])
    assert rc == 0
    data = yaml.safe_load(out.read_text())
    planned_gpus = sum(p["tp"] * p["count"] for p in data["pools"])
    assert data["deployment"] == "disagg" and data["binding"] and planned_gpus <= 4
    result_json = tmp_path / "sim.json"
    rc = main(["sim", "--plan", str(out), "--workload", "chat", "--rate", "4", "--duration", "5", "--quiet",
               "--json", str(result_json)])
    assert rc == 0
    sim = json.loads(result_json.read_text())["deployments"]
    (label,) = sim  # the plan's deployment at its own split, e.g. disagg@1:2
    assert label.startswith("disagg@") and sim[label]["num_gpus"] == planned_gpus


def test_per_role_shapes_run_in_the_simulator(tmp_path: Path) -> None:
    plan_file = tmp_path / "p.yaml"
    plan_file.write_text(yaml.safe_dump({"model": "llama-3.1-8b", "pools": [
        {"role": "prefill", "gpu": "H100-SXM", "tp": 2, "count": 1},
        {"role": "decode", "gpu": "H20", "tp": 1, "count": 3}]}))
    config = SimConfig(**sim_overrides(plan_file))
    assert deployment_label(plan_file) == "disagg@1:3"
    sessions = load_workload("chat", rate_per_s=2, duration_s=5, seed=0)
    result = simulate(sessions, config, SLO())
    # 1 x TP2 + 3 x TP1: a single shared TP would give 8 or 4 GPUs.
    assert result.num_gpus == 5 and result.summary.finished == len(sessions)


@pytest.mark.parametrize("content, words", [
    ("pools: []\n", "no 'pools' list"),
    ("pools: [{role: prefill}]\n", "needs role, gpu, tp and count"),
    ("pools: [{role: prefill, gpu: h100, tp: 1, count: 1}]\n", "a 'prefill' and a 'decode' pool"),
    ("{{not yaml", "not valid YAML"),
])
def test_bad_plan_files_are_one_line_exit_2(tmp_path: Path, content: str, words: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    assert main(["sim", "--plan", str(path), "--workload", "chat", "--duration", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plan" in err[0] and words in err[0], err


def test_sim_compare_plan_runs_the_plan_split(tmp_path: Path) -> None:
    plan_file = tmp_path / "p.yaml"
    plan_file.write_text(yaml.safe_dump({"model": "llama-3.1-8b", "pools": [
        {"role": "prefill", "gpu": "H100-SXM", "tp": 1, "count": 1},
        {"role": "decode", "gpu": "H100-SXM", "tp": 2, "count": 1}]}))
    out = tmp_path / "c.json"
    rc = main(["sim", "compare", "--plan", str(plan_file), "--workload", "chat", "--rates", "2", "--duration", "4",
               "--workers", "1", "--json", str(out)])
    assert rc == 0
    deployments = json.loads(out.read_text())["deployments"]
    assert list(deployments) == ["disagg@1:1"] and deployments["disagg@1:1"]["split"] == {"prefill": 1, "decode": 1}


def test_plan_choose_simulates_the_deployments_and_sim_plan_runs_the_choice(tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    rc = main(["plan", "--workload", "toolbench", "--rate", "3", "--duration", "20", "--gpus", "h100:2,h20:2",
               "--choose", "--choose-duration", "5", "--out", str(out)])
    assert rc == 0
    data = yaml.safe_load(out.read_text())
    chosen = data["chosen_by_simulation"]
    cands = chosen["candidates"]
    assert {c["deployment"] for c in cands} == {"ampd", "disagg", "disagg-offload", "colocated", "colocated-offload"}
    top = max(c["slo_attainment"] for c in cands)
    me = next(c for c in cands if c["deployment"] == chosen["deployment"])
    assert me["slo_attainment"] >= top - 0.005  # the best attainment, or tied with it
    assert data["deployment"] == chosen["deployment"] and chosen["why"].startswith(chosen["label"])
    result_json = tmp_path / "sim.json"
    assert main(["sim", "--plan", str(out), "--workload", "toolbench", "--rate", "3", "--duration", "4", "--quiet",
                 "--json", str(result_json)]) == 0
    (label,) = json.loads(result_json.read_text())["deployments"]
    assert label.partition("@")[0] == chosen["deployment"]
