"""Tool-latency estimate, host-tier eviction, prefill dispatch, the registry factory and traces."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from policy_fakes import FakeView, LinearEstimator, make_request

from tokenomy.core import SLO
from tokenomy.policy.ampd import (
    AMPD_POLICIES,
    AmpdPolicyConfig,
    DispatchConfig,
    HostCopyView,
    HostEvictionPolicy,
    LookaheadReorder,
    PrefillDispatch,
    PrefillTask,
    ReorderConfig,
    ToolLatencyConfig,
    ToolLatencyEstimator,
    build_ampd_policies,
)
from tokenomy.policy.trace import json_value


def test_tool_latency_is_the_prior_until_a_gap_is_seen_then_the_mean_of_gaps() -> None:
    est = ToolLatencyEstimator(ToolLatencyConfig(prior_s=5.0))
    assert est.estimate(0.0).expected_s == 5.0
    est.on_turn_end("a", 10.0)
    est.on_turn_end("b", 11.0)
    est.on_arrival("a", 12.0)  # 2 s
    est.on_arrival("b", 17.0)  # 6 s
    est.on_arrival("c", 20.0)  # never ended a turn: no observation
    e = est.estimate(20.0)
    assert (e.expected_s, e.samples) == (4.0, 2)


def test_tool_latency_forgets_the_oldest_open_call_beyond_its_bound() -> None:
    est = ToolLatencyEstimator(ToolLatencyConfig(prior_s=1.0, max_sessions=1))
    est.on_turn_end("a", 0.0)
    est.on_turn_end("b", 0.0)
    est.on_arrival("a", 100.0)  # forgotten: would have been a 100 s outlier
    assert est.estimate(100.0).samples == 0


def copies(*spec: tuple[str, int, float]) -> list[HostCopyView]:
    return [HostCopyView(sid, nbytes, expire) for sid, nbytes, expire in spec]


@pytest.mark.parametrize(
    ("need", "evict", "store"),
    [
        (40, (), True),  # 100 - 60 used: fits
        (50, ("b",), True),  # the expired copy goes first, though it was stored later
        (70, ("b", "a"), True),  # then the oldest
        (101, (), False),  # larger than the tier: not stored, nothing evicted
    ],
)
def test_host_eviction_takes_expired_copies_then_the_oldest(need: int, evict: tuple[str, ...], store: bool) -> None:
    tier = copies(("a", 20, 50.0), ("b", 20, 5.0), ("c", 20, 50.0))
    d = HostEvictionPolicy().decide("new", need, copies=tier, capacity_bytes=100, now=10.0)
    assert (d.evict, d.store) == (evict, store)


class _Counted:
    """Copies that count how many the policy reads (a caller's lazy view of a full tier)."""

    def __init__(self, views: list[HostCopyView]) -> None:
        self.views, self.read = views, 0

    def __iter__(self) -> Iterator[HostCopyView]:
        for v in self.views:
            self.read += 1
            yield v


def test_host_eviction_told_the_bytes_in_use_reads_copies_only_until_it_has_room() -> None:
    # A full tier of 1,000 copies, the oldest 10 expired: room for 30 bytes takes the first 3.
    views = [HostCopyView(f"s{i}", 10, 5.0 if i < 10 else 50.0) for i in range(1000)]
    policy = HostEvictionPolicy()
    lazy = _Counted(views)
    d = policy.decide("new", 30, copies=lazy, capacity_bytes=10_000, now=10.0, used_bytes=10_000)
    assert d.evict == ("s0", "s1", "s2") and lazy.read == 3
    assert policy.decide("new", 30, copies=views, capacity_bytes=10_000, now=10.0) == d  # summed: the same
    # Not enough expired: every expired one, then the oldest others (two passes).
    d = policy.decide("new", 120, copies=_Counted(views), capacity_bytes=10_000, now=10.0, used_bytes=10_000)
    assert d.evict == tuple(f"s{i}" for i in range(12)) and "evict 10 expired, 2 least recently stored" in d.reason


def tasks(*spec: tuple[str, float, int]) -> list[PrefillTask]:
    return [PrefillTask(rid, 0.0, deadline, tokens, 0) for rid, deadline, tokens in spec]


def test_dispatch_waits_while_the_engine_has_a_step_of_work() -> None:
    d = PrefillDispatch(DispatchConfig(engine_budget_tokens=1000), None)
    queue = tasks(("a", 10.0, 100))
    assert d.decide(queue, engine_waiting_tokens=600, in_flight_tokens=400, now=0.0) is None
    assert d.decide([], engine_waiting_tokens=0, in_flight_tokens=0, now=0.0) is None
    assert d.decide(queue, engine_waiting_tokens=600, in_flight_tokens=0, now=0.0).request_id == "a"


def test_dispatch_reorders_to_meet_more_deadlines_and_says_so() -> None:
    reorder = LookaheadReorder(ReorderConfig(window=5, max_deferrals=3), LinearEstimator())
    d = PrefillDispatch(DispatchConfig(), reorder)
    # The long head (1 s) would make the short task behind it (due at 0.2 s) late.
    queue = tasks(("long", 5.0, 10_000), ("short", 0.2, 1000))
    decision = d.decide(queue, engine_waiting_tokens=0, in_flight_tokens=0, now=0.0)
    assert decision is not None and (decision.request_id, decision.overtaken) == ("short", 1)
    assert "deadline" in decision.reason and queue[0].deferrals == 1


def test_build_ampd_policies_uses_every_registry_entry_and_traces_decisions() -> None:
    events: list[Any] = []
    policies = build_ampd_policies(AmpdPolicyConfig(), LinearEstimator(), pcie_bytes_per_s=25e9, trace=events.append)
    assert policies.built_from == AMPD_POLICIES.names()
    assert policies.binder is not None and policies.placement is not None and policies.retention is not None
    req = make_request(prompt_tokens=3000, history_tokens=2000)
    views = [FakeView("d0"), FakeView("d1")]
    bound = policies.binder.bind(req, views, now=1.0)
    placed = policies.placement.decide(
        req, decode=views[0], prefills=[FakeView("p0")], slo=SLO(), now=1.0, history_cached_tokens_on_decode=2000
    )
    policies.retention.decide(session_id="s1", kv_tokens=3000, expected_tool_latency_s=8.0, kv_usage=0.5, now=2.0)
    kinds = [e["kind"] for e in events]
    assert kinds == ["binding", "placement", "retention"]
    assert events[0]["instance_id"] == bound.instance_id and events[1]["local"] == placed.local
    assert all(e["reason"] for e in events)
    json.dumps(events)  # every event is JSON-ready (enums by value, no infinities)


def test_switched_off_mechanisms_are_built_as_none() -> None:
    cfg = AmpdPolicyConfig(binding=None, placement=None, reorder=None, retention=None)
    p = build_ampd_policies(cfg, LinearEstimator(), pcie_bytes_per_s=25e9)
    assert (p.binder, p.placement, p.retention, p.dispatch.reorder) == (None, None, None, None)


def test_json_value_makes_infinities_null() -> None:
    assert json_value(float("inf")) is None and json_value((1, 2)) == [1, 2]
