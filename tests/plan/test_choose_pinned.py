"""The chooser on candidates with pinned splits and on several inventories (the grid's use)."""

from __future__ import annotations

from dataclasses import replace

from tokenomy.core import SLO
from tokenomy.experiment.choose import choose_on
from tokenomy.experiment.spec import ClusterSpec, DeploymentSpec, ExperimentSpec, WorkloadSpec


def test_a_pinned_split_choice_reports_its_own_result_and_inventory() -> None:
    spec = ExperimentSpec(workload=WorkloadSpec("toolbench", duration_s=4.0),
                          cluster=ClusterSpec(model="llama-3.1-8b", gpus="h100:4"),
                          deployments=(DeploymentSpec.parse("ampd@1:3"), DeploymentSpec.parse("ampd@3:1")),
                          slo=SLO(2.0, 0.1))
    other = replace(spec, cluster=replace(spec.cluster, gpus="h100:4@tp2"),
                    deployments=(DeploymentSpec.parse("ampd@1:1"),))
    choice = choose_on([(spec, spec.deployments), (other, other.deployments)], 4.0)
    assert choice.deployment == "ampd" and choice.split in {(1, 3), (3, 1), (1, 1)}
    mine = next(r for r in choice.results if r.deployment == choice.label)
    assert choice.predicted_goodput_rps == mine.summary.goodput_rps
    assert choice.to_dict()["gpus"] == ("h100:4@tp2" if choice.split == (1, 1) else "h100:4@tp1")
