"""AMPD with no prefill instance (``ampd@0:D``, eleventh round): every turn prefills on its
session's own decode instance (placement rule 1); plain PD disaggregation refuses the split."""

from __future__ import annotations

import pytest

from tokenomy.cli.main import main
from tokenomy.core import SLO, Session, Turn
from tokenomy.experiment import ClusterSpec, DeploymentSpec, ExperimentSpec, WorkloadSpec, parse_split
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import make_variant

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)


def agent_session(sid: str, key: int, start_s: float = 0.0) -> Session:
    """Three turns over one growing stream: every later turn re-reads the previous prompt and answer."""
    sys_tokens, out = 1000, 50
    turns, ctx = [], 0
    for i, new in enumerate((2000, 600, 400)):
        content = ((1, sys_tokens), (key, ctx + new + out))
        turns.append(Turn(prompt_tokens=sys_tokens + ctx + new, output_tokens=out,
                          history_tokens=0 if i == 0 else sys_tokens + ctx, think_time_s=2.0 if i else 0.0,
                          content=content))
        ctx += new + out
    return Session(sid, start_s, tuple(turns))


@pytest.mark.parametrize("variant", ["ampd", "ampd-itl-bound", "ampd-binding"])
def test_every_turn_prefills_on_the_decode_instance_its_session_is_bound_to(variant: str) -> None:
    cfg = make_variant(variant, SimConfig(instances=2, prefill=0, decode=2, deployment="ampd"))
    sessions = [agent_session("a", 10), agent_session("b", 11, start_s=0.3)]
    res = simulate(sessions, cfg, SLO(), perf=PERF)
    assert sorted(r.request_id for r in res.records) == sorted(f"{s}:{t}" for s in "ab" for t in range(3))
    by_session: dict[str, set[str]] = {}
    for rec in res.records:
        assert rec.finished and rec.output_tokens == rec.usage.output_tokens == 50
        rec.usage.check()
        assert rec.prefill_instance == rec.decode_instance and rec.decode_instance.startswith("decode-")
        by_session.setdefault(rec.session_id, set()).add(rec.decode_instance)
        if rec.turn > 0:  # the history stayed on the bound instance: only the new tokens are computed
            assert rec.usage.recomputed_tokens < rec.usage.incremental_prefill_tokens + 16
    assert by_session["a"] != by_session["b"] and all(len(d) == 1 for d in by_session.values())
    assert res.num_gpus == 2 and not res.transfers.bytes_by_kind.get("prompt_kv")  # no KV crossed to a decode


def test_pd_disaggregation_refuses_a_split_without_a_prefill_instance() -> None:
    assert parse_split("0:8") == (0, 8)
    with pytest.raises(ValueError, match="disagg-offload needs >= 1 prefill instance"):
        DeploymentSpec.parse("disagg-offload@0:8")
    with pytest.raises(ValueError, match="prefill must be >= 1, got 0"):
        SimConfig(deployment="disagg", prefill=0, decode=4)
    with pytest.raises(ValueError, match=r"needs >= 1 decode instance"):
        parse_split("8:0")
    # a spec-wide split of 0:D would reach disagg too: refused, naming it
    with pytest.raises(ValueError, match="disagg need >= 1 prefill instance"):
        ExperimentSpec(cluster=ClusterSpec(instances=4), deployments=(DeploymentSpec("ampd"), DeploymentSpec("disagg")),
                       splits=((0, 4), (1, 3)))


def test_ampd_runs_every_split_auto_gives_it_and_the_spec_builds_its_config() -> None:
    spec = ExperimentSpec(workload=WorkloadSpec("toolbench", rate_per_s=1.0, duration_s=10.0),
                          cluster=ClusterSpec(instances=4), splits="auto",
                          deployments=(DeploymentSpec("ampd"), DeploymentSpec("disagg")))
    assert [spec.splits_of(d) for d in spec.deployments] == [[(0, 4), (1, 3), (2, 2), (3, 1)],
                                                             [(1, 3), (2, 2), (3, 1)]]
    config = spec.sim_config(DeploymentSpec.parse("ampd@0:4"), (0, 4))
    assert (config.deployment, config.prefill, config.decode, config.ampd.placement_config.tpot_bank) == (
        "ampd", 0, 4, True)
    # on a mixed inventory every instance of the compute-rich type then decodes beside the other type
    mixed = ExperimentSpec(cluster=ClusterSpec(gpus="h100:2,h20:2"), deployments=(DeploymentSpec.parse("ampd@0:4"),))
    config = mixed.sim_config(mixed.deployments[0], (0, 4))
    assert (config.prefill, config.prefill_type_decodes, config.decode) == (0, 2, 2)


def test_sim_compare_parses_and_runs_a_split_without_prefill(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sim", "compare", "--workload", "toolbench", "--rates", "1", "--duration", "4", "--instances", "2",
               "--deployments", "ampd@0:2,colocated-offload", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0, err
    rc = main(["sim", "compare", "--workload", "toolbench", "--rates", "1", "--duration", "4", "--instances", "2",
               "--deployments", "disagg@0:2", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "disagg needs >= 1 prefill instance" in err and "Traceback" not in err
