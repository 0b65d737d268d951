"""The experiment spec: YAML round trip, validation in one line, the splits it expands to."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenomy.experiment import (
    ClusterSpec,
    DeploymentSpec,
    ExperimentSpec,
    WorkloadSpec,
    dump_spec,
    load_spec,
    spec_from_dict,
)


def _spec(**overrides: object) -> ExperimentSpec:
    base: dict[str, object] = dict(
        workload=WorkloadSpec("toolbench", rate_per_s=1.0, duration_s=10.0, seed=3),
        cluster=ClusterSpec(instances=4),
        deployments=(DeploymentSpec("colocated"), DeploymentSpec("ampd", (1, 3), "least_loaded")),
        rates=(0.5, 1.0),
        splits=((2, 2), (3, 1)),
    )
    return ExperimentSpec(**{**base, **overrides})  # type: ignore[arg-type]


def test_yaml_round_trip(tmp_path: Path) -> None:
    spec = _spec()
    path = dump_spec(spec, tmp_path / "e.yaml")
    assert load_spec(path) == spec
    assert spec_from_dict(spec.to_dict()) == spec


def test_a_result_json_that_embeds_a_spec_loads_as_one(tmp_path: Path) -> None:
    import json

    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": "x", "spec": _spec().to_dict()}))
    assert load_spec(path) == _spec()


def test_splits_expand_per_deployment() -> None:
    spec = _spec(deployments=(DeploymentSpec("colocated"), DeploymentSpec("disagg"), DeploymentSpec("ampd", (1, 3))))
    assert [spec.splits_of(d) for d in spec.deployments] == [[None], [(2, 2), (3, 1)], [(1, 3)]]
    auto = _spec(splits="auto", deployments=(DeploymentSpec("disagg"),))
    assert auto.splits_of(auto.deployments[0]) == [(1, 3), (2, 2), (3, 1)]
    config = spec.sim_config(DeploymentSpec("ampd", None, "least_loaded"), (1, 3))
    assert (config.deployment, config.prefill, config.decode, config.router) == ("ampd", 1, 3, "least_loaded")


def test_the_admission_gates_clients_retry_as_the_spec_says() -> None:
    spec = _spec(cluster=ClusterSpec(instances=4, admission="tier_wfq", max_in_flight=8, max_retries=0),
                 deployments=(DeploymentSpec("colocated"),))
    admission = spec.sim_config(DeploymentSpec("colocated"), None).admission
    assert admission is not None and admission.max_in_flight == 8 and admission.retry.max_retries == 0
    assert spec_from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"workload": {"source": "chat", "rte": 1}}, "spec: workload: unknown key"),
        ({"deployments": ["nope"]}, "unknown deployment 'nope'"),
        ({"deployments": ["ampd@1:1"]}, "1P + 1D = 2 instances, but the cluster has 8"),
        ({"deployments": ["colocated@1:7"]}, "takes no P:D split"),
        ({"rates": [1, -2]}, "rates must be finite numbers > 0"),
        ({"rates": "1,2"}, "rates must be a list"),
        ({"splits": "sometimes"}, "splits must be"),
        ({"slo": {"ttft_s": 0}}, "SLO bounds must be positive"),
        ({"cluster": {"instances": 0}}, "cluster instances must be >= 1"),
        ({"cluster": {"admission": "tier_wfq", "max_retries": -1}}, "cluster max_retries must be >= 0"),
        ({"deployments": []}, "at least one deployment"),
        ({"deployments": ["colocated", "colocated"]}, "repeat a name"),
        ({"extra": 1}, "unknown key(s) extra"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_specs_are_one_line_errors(raw: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        spec_from_dict(raw)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("workload:\n  source: chat\n rates: [1\n")
    with pytest.raises(ValueError, match=r"--spec .*bad.yaml:\d+: not valid YAML"):
        load_spec(path)
