"""The sweep runner: typed results, the same numbers on every executor, a result read back."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tokenomy.experiment import (
    ClusterSpec,
    DeploymentSpec,
    ExperimentSpec,
    SweepResult,
    WorkloadSpec,
    plan_jobs,
    run_sweep,
)
from tokenomy.metrics.report import write_json

SPEC = ExperimentSpec(
    workload=WorkloadSpec("toolbench", duration_s=8.0, seed=2),
    cluster=ClusterSpec(instances=3),
    deployments=(DeploymentSpec("colocated"), DeploymentSpec("disagg")),
    rates=(0.5, 2.0),
    splits=((1, 2), (2, 1)),
)


def _numbers(result: SweepResult) -> dict[str, object]:
    return {name: (c.split, c.attainment, [r.summary.ttft_p99_s for r in c.runs], c.max_rate_at_target)
            for name, c in result.best.items()}


def test_jobs_cover_every_deployment_split_and_rate() -> None:
    jobs = plan_jobs(SPEC)
    assert len(jobs) == 2 + 2 * 2
    assert {(j.deployment.name, j.split) for j in jobs} == {("colocated", None), ("disagg", (1, 2)),
                                                            ("disagg", (2, 1))}


def test_inline_and_pool_give_the_same_numbers_and_the_best_split_wins() -> None:
    inline = run_sweep(SPEC, executor="inline")
    pooled = run_sweep(SPEC, executor="pool", workers=2)
    assert _numbers(inline) == _numbers(pooled)
    disagg = inline.best["disagg"]
    assert disagg.score() == max(c.score() for c in inline.tried["disagg"])
    assert all(r.num_gpus == 3 for c in inline.best.values() for r in c.runs)


def test_result_json_embeds_the_spec_and_reads_back(tmp_path: Path) -> None:
    result = run_sweep(SPEC, executor="inline")
    path = write_json(tmp_path / "r.json", result.to_dict())
    raw = json.loads(path.read_text())
    assert raw["schema"] == "tokenomy.sim-compare/2" and raw["spec"] == SPEC.to_dict()
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    back = SweepResult.from_dict(raw)
    assert back.spec == SPEC and _numbers(back) == _numbers(result)


def test_a_local_ray_instance_gives_the_pools_numbers() -> None:
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'tokenomy[ray]')")
    small = ExperimentSpec(workload=SPEC.workload, cluster=ClusterSpec(instances=2),
                           deployments=(DeploymentSpec("colocated"), DeploymentSpec("ampd")), rates=(1.0,))
    from tokenomy.experiment.ray_executor import RAY_DID_NOT_START

    try:
        on_ray = run_sweep(small, executor="ray", workers=1, address="local")
    except ValueError as exc:
        if RAY_DID_NOT_START not in str(exc):
            raise
        pytest.skip(f"a local Ray instance did not start on this machine: {exc}")
    assert _numbers(on_ray) == _numbers(run_sweep(small, executor="inline"))
