"""AMPD's late turn lent to its prefill instance (``ampd-lend``), and a decode pool of two GPU
types (a mixed inventory whose compute-rich type also decodes)."""

from __future__ import annotations

from dataclasses import replace

from tokenomy.core import SLO, Session, Turn
from tokenomy.experiment.jobs import load_sessions
from tokenomy.experiment.spec import ClusterSpec, DeploymentSpec, ExperimentSpec, WorkloadSpec
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import make_variant

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)
SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)
# 0.25 of an H100 leaves ~25k tokens of KV for an 8B: one 18k-token turn at a time
SMALL = SimConfig(instances=2, prefill=1, decode=1, gpu_memory_utilization=0.25)


def one_turn(sid: str, key: int, start_s: float, output: int) -> Session:
    return Session(sid, start_s, (Turn(prompt_tokens=18_000, output_tokens=output, content=((key, 18_000),)),))


def run(variant: str) -> dict[str, tuple[float, str]]:
    """"a" decodes 1500 tokens (~10 s) on the only decode instance; "b" then waits in its engine
    and "c" in its admission queue. TTFT and decode instance by session."""
    sessions = [one_turn("a", 1, 0.0, 1500), one_turn("b", 2, 0.3, 20), one_turn("c", 3, 0.6, 20)]
    res = simulate(sessions, make_variant(variant, SMALL), SLO_, perf=PERF)
    assert sorted(r.session_id for r in res.records) == ["a", "b", "c"]  # each once
    for r in res.records:
        assert r.finished and r.output_tokens == r.usage.output_tokens
        r.usage.check()
    return {r.session_id: (r.ttft_s or 0.0, r.decode_instance) for r in res.records}


def test_a_turn_held_past_its_ttft_deadline_is_decoded_by_its_prefill_instance() -> None:
    held = run("ampd")
    assert held["c"][1] == "decode-0" and held["c"][0] > 5.0  # waited for "a" to finish
    lent = run("ampd-lend")
    assert lent["c"][1] == "prefill-0"
    assert SLO_.ttft_s <= lent["c"][0] < SLO_.ttft_s + 0.5  # lent when its deadline passed
    assert lent["b"] == held["b"]  # the turn the engine already took stays


def test_a_held_turn_borrows_its_prefill_instance_and_moves_back_when_its_decode_instance_has_room() -> None:
    # "c" would wait ~16 s for "a" (and "b") to leave the only decode instance
    sessions = [one_turn("a", 1, 0.0, 1500), one_turn("b", 2, 0.3, 20), one_turn("c", 3, 0.6, 3000)]
    cfg = make_variant("ampd-borrow", SMALL)
    cfg = replace(cfg, ampd=replace(cfg.ampd, retention=False))  # no pins: "a"'s blocks free when it ends
    res = simulate(sessions, cfg, SLO_, perf=PERF)
    by = {r.session_id: r for r in res.records}
    assert sorted(by) == ["a", "b", "c"]
    c = by["c"]
    assert c.ttft_s is not None and c.ttft_s < SLO_.ttft_s  # its first tokens came from prefill-0 at once
    assert c.finished and c.output_tokens == 3000 == c.usage.output_tokens  # none lost or doubled in the move
    assert c.decode_instance == "decode-0"  # it ended where it was bound
    assert c.max_itl_s < 0.5  # the move (its KV over the link) paused the stream briefly
    assert c.tpot_s is not None and c.tpot_s < SLO_.tpot_s
    c.usage.check()


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
