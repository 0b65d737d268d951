from __future__ import annotations

import pytest

from tokenomy.eaas.balance import (
    max_over_mean,
    naive_placement,
    plan_placement,
    replica_counts,
    server_loads,
)


def test_naive_placement_puts_replicas_on_consecutive_servers() -> None:
    assert naive_placement(4, ["a", "b"], replicas=2) == {"a": (0, 1, 2, 3), "b": (0, 1, 2, 3)}
    assert naive_placement(4, ["a", "b", "c"]) == {"a": (0, 3), "b": (1,), "c": (2,)}
    with pytest.raises(ValueError, match="replicas"):
        naive_placement(4, ["a"], replicas=2)


def test_extra_replicas_go_to_the_hottest_experts() -> None:
    counts = replica_counts({0: 60.0, 1: 30.0, 2: 10.0}, total_slots=6, max_replicas=4)
    assert counts == {0: 3, 1: 2, 2: 1}
    with pytest.raises(ValueError, match="cannot hold"):
        replica_counts({0: 1.0, 1: 1.0}, total_slots=3, max_replicas=2, min_replicas=2)


def test_plan_respects_slots_never_doubles_a_copy_and_hosts_every_expert() -> None:
    load = {e: 100.0 / (e + 1) for e in range(8)}
    servers = ["s0", "s1", "s2", "s3"]
    plan = plan_placement(load, servers, slots_per_server=3)
    assert all(len(ids) <= 3 and len(set(ids)) == len(ids) for ids in plan.values())
    assert set().union(*plan.values()) == set(range(8))
    assert max_over_mean(server_loads(plan, load)) < max_over_mean(server_loads(naive_placement(8, servers), load))


@pytest.mark.parametrize("exponent", [0.8, 1.2, 1.6])
def test_replication_brings_zipf_skew_within_1_25(exponent: float) -> None:
    pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
    from tokenomy.eaas.skew import SkewConfig, run_skew

    r = run_skew(SkewConfig(zipf_exponent=exponent, batches=150))
    assert r.max_over_mean_before > 1.25
    assert r.max_over_mean_after <= 1.25
    assert sum(r.loads_after.values()) == sum(r.loads_before.values())


def test_zipf_popularity_is_a_distribution_with_a_hot_head() -> None:
    pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
    from tokenomy.eaas.skew import zipf_popularity

    p = zipf_popularity(16, 1.2, seed=0)
    assert abs(float(p.sum()) - 1) < 1e-9 and float(p.max()) > 5 * float(p.min())


def test_server_loads_refuses_a_placement_that_drops_an_expert() -> None:
    with pytest.raises(ValueError, match="no copy of experts \\[1\\]"):
        server_loads({"a": (0,)}, {0: 1.0, 1: 2.0})
