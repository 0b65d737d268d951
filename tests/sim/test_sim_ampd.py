"""The AMPD deployment: every mechanism runs, nothing is lost, and the ablation switches work."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenomy.core import SLO, Session, TokenUsage, Turn
from tokenomy.perf import PerfModel
from tokenomy.policy.ampd import BindingConfig, PlacementConfig
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import VARIANTS, make_variant
from tokenomy.workload.registry import load_workload

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)
BASE = SimConfig(instances=4, prefill=2, decode=2)


def agent_session(sid: str, key: int, start_s: float = 0.0) -> Session:
    """Three turns over one growing stream: every later turn re-reads the previous prompt and answer."""
    sys_tokens, out = 1000, 50
    turns, ctx = [], 0
    for i, new in enumerate((2000, 600, 400)):
        prompt = sys_tokens + ctx + new
        content = ((1, sys_tokens), (key, ctx + new + out))
        history = 0 if i == 0 else sys_tokens + ctx
        turns.append(Turn(prompt_tokens=prompt, output_tokens=out, history_tokens=history, think_time_s=2.0 if i else 0.0, content=content))
        ctx += new + out
    return Session(sid, start_s, tuple(turns))


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.startswith("ampd")])
def test_every_ampd_variant_finishes_every_request_once_with_exact_classes(variant: str) -> None:
    sessions = load_workload("toolbench", rate_per_s=2.0, duration_s=20.0, seed=5)
    res = simulate(sessions, make_variant(variant, BASE), SLO(), perf=PERF)
    ids = [r.request_id for r in res.records]
    assert len(ids) == len(set(ids)) == sum(len(s.turns) for s in sessions)
    for rec in res.records:
        assert rec.finished and rec.output_tokens == rec.usage.output_tokens
        rec.usage.check()


def test_later_turns_reuse_the_history_kept_on_the_bound_decode_instance() -> None:
    sessions = [agent_session("a", 10), agent_session("b", 11, start_s=0.5)]
    res = simulate(sessions, make_variant("ampd", BASE), SLO(), perf=PERF)
    by_session: dict[str, set[str]] = {}
    for rec in res.records:
        by_session.setdefault(rec.session_id, set()).add(rec.decode_instance)
        if rec.turn > 0:
            # Everything but the newest tool result was kept: no history is recomputed.
            assert rec.usage.recomputed_tokens < rec.usage.incremental_prefill_tokens + 16
    assert all(len(decodes) == 1 for decodes in by_session.values())  # binding is sticky


def test_idle_cluster_runs_incremental_prefills_locally_and_first_turns_remotely() -> None:
    # Decode steps wide enough to take a whole increment in one chunk (vLLM's default budget).
    cfg = make_variant("ampd", BASE)
    cfg = replace(cfg, ampd=replace(cfg.ampd, placement_config=PlacementConfig(local_budget_tokens=2048)))
    res = simulate([agent_session("a", 10)], cfg, SLO(), perf=PERF)
    first, *later = sorted(res.records, key=lambda r: r.turn)
    assert first.prefill_instance.startswith("prefill-")
    # With no queue anywhere, a small incremental prefill is faster where the history already is.
    assert all(r.prefill_instance == r.decode_instance for r in later)


def test_without_placement_every_prefill_is_remote() -> None:
    res = simulate([agent_session("a", 10)], make_variant("ampd-binding", BASE), SLO(), perf=PERF)
    assert all(r.prefill_instance.startswith("prefill-") for r in res.records)


def test_kv_retention_cuts_recompute_when_the_gpu_cannot_hold_sessions_across_tool_calls() -> None:
    # A GPU cache too small to keep every session through its tool call: without retention the
    # history is evicted and recomputed; with it, it is offloaded to host and reloaded over PCIe.
    sessions = [agent_session(f"s{i}", 100 + i, start_s=0.05 * i) for i in range(24)]

    def recomputed(variant: str) -> tuple[int, int]:
        cfg = replace(make_variant(variant, BASE), gpu_memory_utilization=0.23)
        res = simulate(sessions, cfg, SLO(), perf=PERF)
        assert all(r.finished for r in res.records)
        later = [r for r in res.records if r.turn > 0]
        return sum(r.usage.recomputed_tokens for r in later), sum(r.usage.transferred_tokens for r in later)

    kept_recomputed, kept_transferred = recomputed("ampd")
    lost_recomputed, _ = recomputed("ampd-binding-placement-reorder")
    assert kept_recomputed < lost_recomputed
    assert kept_transferred > 0


def moved_turns(variant: str, gpu_memory_utilization: float, *, move: bool) -> list[TokenUsage]:
    """Usage of the later turns that ran on another instance than the session's previous turn."""
    sessions = [agent_session(f"s{i}", 100 + i, start_s=0.05 * i) for i in range(24)]
    cfg = replace(make_variant(variant, BASE), gpu_memory_utilization=gpu_memory_utilization)
    cfg = replace(cfg, ampd=replace(cfg.ampd, binding_config=BindingConfig(move_history_on_rebind=move)))
    res = simulate(sessions, cfg, SLO(), perf=PERF)
    last: dict[str, str] = {}
    moved = []
    for rec in sorted(res.records, key=lambda r: (r.session_id, r.turn)):
        if rec.turn > 0 and last[rec.session_id] != rec.decode_instance:
            moved.append(rec.usage)
        last[rec.session_id] = rec.decode_instance
    return moved


def test_a_rebound_session_takes_its_history_along_instead_of_recomputing_it() -> None:
    # Decode memory so tight that sessions outgrow their instance and are rebound mid-session.
    with_history, without = moved_turns("ampd", 0.24, move=True), moved_turns("ampd", 0.24, move=False)
    assert with_history and without
    # Only the new tokens are computed after a rebind that carries the history ...
    assert all(u.recomputed_tokens <= u.incremental_prefill_tokens + 16 for u in with_history)
    # ... while without it the new instance recomputes the session's history.
    assert sum(u.recomputed_tokens for u in without) > 2 * sum(u.incremental_prefill_tokens for u in without)


def test_the_host_tier_baseline_moves_history_with_a_session_its_router_moves() -> None:
    with_history = moved_turns("colocated-offload", 0.23, move=True)
    without = moved_turns("colocated-offload", 0.23, move=False)
    assert with_history and len(with_history) == len(without)
    assert sum(u.transferred_tokens for u in with_history) > 0 == sum(u.transferred_tokens for u in without)
    assert sum(u.recomputed_tokens for u in with_history) < sum(u.recomputed_tokens for u in without)


def test_unknown_variant_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="known: colocated"):
        make_variant("nope", BASE)


def test_h20_decode_node_takes_increments_in_chunks_sized_to_its_itl_slack() -> None:
    # 70B, one H100-TP4 prefill instance, one H20-TP4 decode instance. Ten sessions' 22k-token
    # first turns queue on the prefill instance; their 600-token second turns come 0.2 s after
    # each answer. A 512-token chunk of a 70B prefill takes ~0.2 s on the H20s (past the 100 ms
    # ITL bound), so with fixed chunks every increment waits behind the queue; sized to the
    # decode batch's slack, they run locally in small chunks, within the bound.
    het = SimConfig(deployment="ampd", model="llama-3.1-70b", gpu="h100", tp=4, instances=2, prefill=1, decode=1,
                    decode_gpu="h20", decode_tp=4)
    sys_tokens, first, new, out = 2000, 20_000, 600, 40
    sessions = []
    for i in range(10):
        t0 = Turn(prompt_tokens=sys_tokens + first, output_tokens=out, history_tokens=0, think_time_s=0.0,
                  content=((1, sys_tokens), (100 + i, first + out)))
        t1 = Turn(prompt_tokens=sys_tokens + first + out + new, output_tokens=out,
                  history_tokens=sys_tokens + first + out, think_time_s=0.2,
                  content=((1, sys_tokens), (100 + i, first + out + new + out)))
        sessions.append(Session(f"s{i}", 0.1 * i, (t0, t1)))
    slo = SLO(ttft_s=10.0, tpot_s=0.1)
    sized = make_variant("ampd-itl-bound", het)  # no TPOT bank: every step within the ITL bound
    fixed = replace(sized, ampd=replace(sized.ampd, placement_config=replace(sized.ampd.placement_config,
                                                                              size_local_chunks=False)))
    later = {}
    for name, cfg in (("sized", sized), ("fixed", fixed)):
        res = simulate(sessions, cfg, slo)
        later[name] = [r for r in res.records if r.turn == 1]
        assert all(r.max_itl_s <= slo.tpot_s for r in res.records)
    assert not any(r.prefill_instance == r.decode_instance for r in later["fixed"])
    local = [r for r in later["sized"] if r.prefill_instance == r.decode_instance]
    assert len(local) >= 8
    assert all(r.first_token_s is not None and r.first_token_s - r.arrival_s < 1.0 for r in local)
    worst_fixed = max(r.first_token_s - r.arrival_s for r in later["fixed"] if r.first_token_s is not None)
    assert worst_fixed > 5.0  # behind the first turns on the prefill instance
