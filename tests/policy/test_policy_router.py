"""Routers on crafted views, and the router registry."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from policy_fakes import FakeView, make_request

from tokenomy.policy import ROUTERS, make_router
from tokenomy.policy.registry import Registry
from tokenomy.policy.router import SessionAffinityRouter, cheapest_instance, prefix_cost_blocks


def test_registry_lists_the_routers() -> None:
    assert set(ROUTERS.names()) == {"round_robin", "least_loaded", "prefix_aware", "session_affinity", "tier_aware"}


def test_unknown_router_fails_with_known_names() -> None:
    with pytest.raises(ValueError, match="unknown router 'fastest'.*round_robin.*session_affinity"):
        make_router("fastest")


def test_bad_router_option_is_a_one_line_value_error() -> None:
    with pytest.raises(ValueError, match="router 'round_robin': bad options"):
        make_router("round_robin", overlap_weight=2.0)
    with pytest.raises(ValueError, match="kv_usage_threshold"):
        make_router("session_affinity", kv_usage_threshold=1.5)


def test_duplicate_registration_fails() -> None:
    reg: Registry[int] = Registry("thing")
    reg.register("a")(1)
    with pytest.raises(ValueError, match="'a' is already registered"):
        reg.register("a")(2)


@pytest.mark.parametrize("name", ["round_robin", "least_loaded", "prefix_aware", "session_affinity"])
def test_routing_to_no_instance_fails(name: str) -> None:
    with pytest.raises(ValueError, match="no instances"):
        make_router(name).choose(make_request(), [], now=0.0)


def test_round_robin_cycles_in_given_order() -> None:
    router = make_router("round_robin")
    views = [FakeView("a"), FakeView("b"), FakeView("c")]
    picks = [router.choose(make_request(), views, now=float(t)) for t in range(5)]
    assert picks == ["a", "b", "c", "a", "b"]


@pytest.mark.parametrize(
    ("views", "expected"),
    [
        ([FakeView("a", num_waiting_tokens=500), FakeView("b", num_waiting_tokens=100)], "b"),
        # equal waiting tokens: fewer requests wins
        ([FakeView("a", num_waiting_tokens=100, num_running=5), FakeView("b", num_waiting_tokens=100)], "b"),
        # full tie: smallest id, whatever the order given
        ([FakeView("b"), FakeView("a")], "a"),
        # tokens dominate request counts
        ([FakeView("a", num_waiting_tokens=0, num_running=30), FakeView("b", num_waiting_tokens=4000)], "a"),
    ],
)
def test_least_loaded(views: list[FakeView], expected: str) -> None:
    assert make_router("least_loaded").choose(make_request(), views, now=0.0) == expected


def test_prefix_cost_matches_dynamo_formula() -> None:
    # 1000-token prompt, 640 cached -> 360 to prefill = 23 blocks of 16; load = 200 held + 7 queued blocks
    view = FakeView("a", cached_tokens=640, free_blocks=800, total_blocks=1000, num_waiting_tokens=100)
    assert prefix_cost_blocks(make_request(prompt_tokens=1000), view, overlap_weight=2.0) == 2 * 23 + 207


@pytest.mark.parametrize(
    ("views", "expected"),
    [
        # the cache hit saves more blocks than the extra load costs
        ([FakeView("a", free_blocks=990), FakeView("b", cached_tokens=960, free_blocks=950)], "b"),
        # a heavily loaded instance loses despite its cache hit
        ([FakeView("a", free_blocks=990), FakeView("b", cached_tokens=960, free_blocks=200)], "a"),
        # same cost: smallest id
        ([FakeView("b"), FakeView("a")], "a"),
    ],
)
def test_prefix_aware(views: list[FakeView], expected: str) -> None:
    assert make_router("prefix_aware").choose(make_request(prompt_tokens=1000), views, now=0.0) == expected


def test_session_affinity_is_sticky_while_kv_below_threshold() -> None:
    router = make_router("session_affinity", kv_usage_threshold=0.9)
    a, b = FakeView("a", cached_tokens=1000), FakeView("b")
    assert router.choose(make_request(session_id="s"), [a, b], now=0.0) == "a"
    # a is now busier and uncached, b would win on cost, but the session stays on a
    a.cached_tokens, a.free_blocks, a.kv_usage = 0, 300, 0.7
    assert router.choose(make_request(session_id="s"), [a, b], now=1.0) == "a"
    # a crosses the threshold: fall back to prefix-aware, and the session moves for good
    a.kv_usage = 0.95
    assert router.choose(make_request(session_id="s"), [a, b], now=2.0) == "b"
    a.kv_usage = 0.1
    assert router.choose(make_request(session_id="s"), [a, b], now=3.0) == "b"


def test_session_affinity_without_session_routes_by_prefix_cost() -> None:
    router = make_router("session_affinity")
    views = [FakeView("a", free_blocks=100), FakeView("b")]
    assert router.choose(make_request(session_id=""), views, now=0.0) == "b"


def test_session_affinity_forgets_oldest_sessions_beyond_capacity() -> None:
    router = SessionAffinityRouter(max_sessions=2)
    views = [FakeView("a")]
    for sid in ("s1", "s2", "s3"):
        router.choose(make_request(session_id=sid), views, now=0.0)
    assert router.bound_instance("s1") is None
    assert router.bound_instance("s3") == "a"


@dataclass
class _CountingView(FakeView):
    """A FakeView that counts its prefix lookups."""

    lookups: int = 0

    def cached_prefix_tokens(self, content: tuple[tuple[int, int], ...], prompt_tokens: int) -> int:
        self.lookups += 1
        return super().cached_prefix_tokens(content, prompt_tokens)


@pytest.mark.parametrize("weight", [0.0, 1.0, 2.5])
def test_prefix_aware_choice_is_the_cheapest_of_all_while_pricing_fewer(weight: float) -> None:
    """Branch and bound on the load gives the instance that pricing every one gives (lowest cost,
    then lowest id, ties included), and leaves out the lookups of instances too loaded to win."""
    rng = random.Random(7)
    router = make_router("prefix_aware", overlap_weight=weight)
    priced = total = 0
    for _ in range(300):
        views = [
            _CountingView(
                f"i{k}",
                # coarse values: ties in load and in cost happen often
                free_blocks=1000 - 100 * rng.randrange(8),
                num_waiting_tokens=160 * rng.randrange(4),
                cached_tokens=320 * rng.randrange(4),
            )
            for k in rng.sample(range(8), 8)  # ids in a random order
        ]
        request = make_request(prompt_tokens=1000)
        expected = min(views, key=lambda v: (prefix_cost_blocks(request, v, weight), v.instance_id)).instance_id
        for v in views:
            v.lookups = 0
        assert router.choose(request, views, now=0.0) == expected
        assert cheapest_instance(request, views, weight) == expected
        priced += sum(v.lookups for v in views) // 2
        total += len(views)
    assert priced < total * 0.5  # instances loaded past the best cost found were not priced
