"""The simulator decides nothing itself: AMPD and the host-tier baselines apply decisions of the
policy objects that ``build_ampd_policies`` builds from the ``AMPD_POLICIES`` registry, the same
entries a live gateway builds from, and every decision they apply reaches the decision trace."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from tokenomy.core import SLO
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import make_variant
from tokenomy.workload.registry import load_workload

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)
BASE = SimConfig(instances=4, prefill=2, decode=2, gpu_memory_utilization=0.3)


def test_ampd_builds_every_decision_maker_from_the_registry(spied_registry: dict[str, list[Any]]) -> None:
    events: list[Mapping[str, Any]] = []
    sessions = load_workload("gaia", rate_per_s=1.0, duration_s=6.0, seed=3)
    simulate(sessions, make_variant("ampd", BASE), SLO(), perf=PERF, decision_trace=events.append)
    assert all(len(objs) == 1 for objs in spied_registry.values()), spied_registry
    kinds = Counter(e["kind"] for e in events)
    for kind in ("binding", "placement", "dispatch", "retention", "tool_latency", "admission"):
        assert kinds[kind] > 0, kinds
    # each placement the simulator applied carries its reason and names its request
    placements = [e for e in events if e["kind"] == "placement"]
    assert all(e["reason"] and e["request_id"] for e in placements)
    # one binding and one placement per turn, and a binding per move of a turn (held or queued)
    moves = [e for e in events if e["kind"] == "binding" and e["reason"].startswith(
        ("turn would wait for memory", "bound instance is queued"))]
    assert kinds["binding"] == kinds["placement"] + len(moves)
    json.dumps(events)


@pytest.mark.parametrize("variant", ["colocated-offload", "disagg-offload"])
def test_host_tier_baselines_use_the_same_retention_policies(
    variant: str, spied_registry: dict[str, list[Any]]
) -> None:
    events: list[Mapping[str, Any]] = []
    sessions = load_workload("gaia", rate_per_s=1.0, duration_s=6.0, seed=3)
    simulate(sessions, make_variant(variant, BASE), SLO(), perf=PERF, decision_trace=events.append)
    assert len(spied_registry["retention"]) == 1 and len(spied_registry["tool_latency"]) == 1
    kinds = Counter(e["kind"] for e in events)
    assert kinds["retention"] > 0 and kinds["placement"] == 0  # no AMPD placement in a baseline
