"""Tenant mixes: parsing, deterministic assignment, and sessions that already name a tenant."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from tokenomy.workload import TenantMix, assign_tenants, load_workload


def test_a_mix_is_parsed_and_refused_with_the_bad_entry_named() -> None:
    mix = TenantMix.parse("gold:0.2,silver:0.3,free:0.5:3")
    assert [(t.tier, t.share, t.tenants) for t in mix.tiers] == [("gold", 0.2, 1), ("silver", 0.3, 1), ("free", 0.5, 3)]
    assert mix.tiers[2].tenant_names() == ["free-0", "free-1", "free-2"]
    for text, msg in (("gold", "expected TIER:SHARE"), ("gold:x", "SHARE must be a number"),
                      ("gold:-1", "share must be a finite number > 0"), ("gold:1,gold:2", "names a tier twice"),
                      ("", "no entries")):
        with pytest.raises(ValueError, match=msg):
            TenantMix.parse(text)


def test_assignment_follows_the_shares_and_the_seed() -> None:
    sessions = load_workload("chat", rate_per_s=50, duration_s=40, seed=1)
    mix = TenantMix.parse("gold:0.2,silver:0.3,free:0.5")
    a = assign_tenants(sessions, mix, seed=1)
    assert a == assign_tenants(sessions, mix, seed=1) != assign_tenants(sessions, mix, seed=2)
    share = Counter(s.tier for s in a)
    n = len(a)
    assert abs(share["gold"] / n - 0.2) < 0.04 and abs(share["free"] / n - 0.5) < 0.04
    assert all(s.tenant == s.tier for s in a)


def test_sessions_that_name_a_tenant_keep_it() -> None:
    sessions = load_workload("chat", rate_per_s=5, duration_s=4, seed=0)
    sessions[0] = dataclasses.replace(sessions[0], tenant="acme", tier="silver")
    a = assign_tenants(sessions, TenantMix.parse("gold:1"), seed=0)
    assert (a[0].tenant, a[0].tier) == ("acme", "silver")
    assert {(s.tenant, s.tier) for s in a[1:]} == {("gold", "gold")}


def test_load_workload_assigns_tenants_and_says_so() -> None:
    from tokenomy.workload import load_workload_info

    sessions, info = load_workload_info("gaia", rate_per_s=1, duration_s=10, tenants="gold:0.5,free:0.5")
    assert {s.tier for s in sessions} <= {"gold", "free"} and all(s.tier for s in sessions)
    assert any("tenants drawn from gold:0.5,free:0.5" in n for n in info.notes)
