"""The fair baselines: colocated and disaggregated serving with AMPD's host KV tier."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_sim_ampd import BASE, PERF, agent_session

from tokenomy.core import SLO
from tokenomy.sim import simulate
from tokenomy.sim.variants import is_disaggregated, make_variant
from tokenomy.workload.registry import load_workload


@pytest.mark.parametrize("variant", ["colocated-offload", "disagg-offload"])
def test_offload_baselines_finish_every_request_once_with_exact_classes(variant: str) -> None:
    sessions = load_workload("gaia", rate_per_s=1.0, duration_s=8.0, seed=5)
    res = simulate(sessions, make_variant(variant, BASE), SLO(), perf=PERF)
    ids = [r.request_id for r in res.records]
    assert len(ids) == len(set(ids)) == sum(len(s.turns) for s in sessions)
    for rec in res.records:
        assert rec.finished and rec.output_tokens == rec.usage.output_tokens
        rec.usage.check()


@pytest.mark.parametrize(("plain", "offload"), [("colocated-affinity", "colocated-offload"), ("disagg", "disagg-offload")])
def test_host_tier_reloads_history_the_gpu_cache_lost_instead_of_recomputing_it(plain: str, offload: str) -> None:
    # GPU caches too small to keep every session through its tool call (as in the AMPD test).
    sessions = [agent_session(f"s{i}", 100 + i, start_s=0.05 * i) for i in range(24)]

    def later_turns(variant: str) -> tuple[int, int]:
        cfg = replace(make_variant(variant, BASE), gpu_memory_utilization=0.23)
        res = simulate(sessions, cfg, SLO(), perf=PERF)
        assert all(r.finished for r in res.records)
        later = [r for r in res.records if r.turn > 0]
        return sum(r.usage.recomputed_tokens for r in later), sum(r.usage.transferred_tokens for r in later)

    plain_recomputed, _ = later_turns(plain)
    tier_recomputed, tier_transferred = later_turns(offload)
    assert tier_recomputed < plain_recomputed
    assert tier_transferred > 0


def test_offload_baselines_keep_their_split_search() -> None:
    assert not is_disaggregated("colocated-offload")
    assert is_disaggregated("disagg-offload")
