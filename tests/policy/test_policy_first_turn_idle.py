"""A first turn on an idle decode node while the prefill pool is busy (``first_turn_on_idle_decode``)."""

from __future__ import annotations

from typing import Any

from policy_fakes import FakeView, LinearEstimator, make_request

from tokenomy.core import SLO, Role
from tokenomy.policy.ampd import AdaptivePlacement, PlacementConfig, PlacementDecision

SLO_ = SLO(ttft_s=10.0, tpot_s=0.05)
PROMPT = 20_000  # 2.0 s of prefill at LinearEstimator's 1e-4 s per token


def decide(decode: FakeView, prefill: FakeView, **overrides: Any) -> PlacementDecision:
    config = PlacementConfig(local_budget_tokens=512, size_local_chunks=True, **overrides)
    return AdaptivePlacement(config, LinearEstimator()).decide(
        make_request(prompt_tokens=PROMPT), decode=decode, prefills=[prefill], slo=SLO_, now=0.0,
        history_cached_tokens_on_decode=0,
    )


def busy_prefill(waiting_tokens: int = 16_000, cached: int = 0) -> FakeView:
    return FakeView("p", role=Role.PREFILL, num_waiting_tokens=waiting_tokens, cached_tokens=cached)


IDLE = FakeView("d", free_blocks=10_000, total_blocks=10_000)


def test_an_idle_decode_node_prefills_a_first_turn_in_full_steps_when_the_prefill_pool_queues() -> None:
    d = decide(IDLE, busy_prefill(), first_turn_on_idle_decode=True)
    assert d.local and d.prefill_instance is None
    assert d.chunk_tokens == PlacementConfig().prefill_budget_tokens  # full steps, not ITL-sized ones
    assert abs(d.est_ttft_local_s - PROMPT * 1e-4) < 1e-9  # its prefill alone: no queue on an idle node
    assert d.est_ttft_local_s < d.est_ttft_remote_s  # the prefill node's 1.6 s of queue come first there


def test_without_the_switch_the_same_first_turn_queues_on_the_prefill_node() -> None:
    d = decide(IDLE, busy_prefill())
    assert not d.local and d.prefill_instance == "p"  # remote is on time (10 s SLO), so it goes there


def test_a_decode_node_that_runs_anything_is_not_idle() -> None:
    for busy in (FakeView("d", num_running=1, num_decoding=1, decode_context_tokens=4000),
                 FakeView("d", num_waiting=1, num_waiting_tokens=300)):
        d = decide(busy, busy_prefill(), first_turn_on_idle_decode=True)
        assert not d.local and d.prefill_instance == "p"


def test_an_idle_prefill_pool_keeps_its_first_turns() -> None:
    # nothing queued on the prefill node: it prefills as soon as the decode node would
    d = decide(IDLE, busy_prefill(waiting_tokens=0), first_turn_on_idle_decode=True)
    assert not d.local and d.prefill_instance == "p"


def test_the_prefill_node_keeps_a_first_turn_it_serves_sooner() -> None:
    # the prefill node's cache holds 19k of the 20k tokens: its 0.8 s of queue + 0.1 s beat 2.0 s
    d = decide(IDLE, busy_prefill(waiting_tokens=8_000, cached=19_000), first_turn_on_idle_decode=True)
    assert not d.local and d.prefill_instance == "p"
    assert d.est_ttft_remote_s < PROMPT * 1e-4


def test_a_decode_node_without_kv_room_is_never_chosen() -> None:
    full = FakeView("d", free_blocks=100, total_blocks=10_000)
    d = decide(full, busy_prefill(), first_turn_on_idle_decode=True)
    assert not d.local
