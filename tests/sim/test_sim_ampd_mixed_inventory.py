"""AMPD's decode pool of two GPU types: a mixed inventory whose compute-rich type also decodes."""

from __future__ import annotations

from tokenomy.core import SLO
from tokenomy.experiment.jobs import load_sessions
from tokenomy.experiment.spec import ClusterSpec, DeploymentSpec, ExperimentSpec, WorkloadSpec
from tokenomy.sim import simulate

SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)


def test_a_split_of_a_mixed_inventory_decodes_on_the_compute_rich_type_too() -> None:
    spec = ExperimentSpec(workload=WorkloadSpec("toolbench", duration_s=5.0),
                          cluster=ClusterSpec(model="llama-3.1-8b", gpus="h100:2,h20:2"),
                          deployments=(DeploymentSpec.parse("ampd@1:3"), DeploymentSpec.parse("disagg@2:2")))
    ampd = spec.sim_config(spec.deployments[0], spec.splits_of(spec.deployments[0])[0])
    assert (ampd.prefill, ampd.prefill_type_decodes, ampd.decode) == (1, 1, 2)
    assert spec.sim_config(spec.deployments[1], (2, 2)).prefill_type_decodes == 0  # the inventory's own split
    sessions = load_sessions(spec, 2.0)[0]
    res = simulate(sessions, ampd, SLO_)
    assert res.num_gpus == 4
    assert len(res.records) == sum(len(s.turns) for s in sessions)
    used = {r.decode_instance for r in res.records}
    assert "decode-0" in used and used & {"decode-1", "decode-2"}  # the H100 decodes beside the H20s
