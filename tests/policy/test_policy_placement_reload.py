"""Placement with the host tier priced: history only in the decode node's host memory must come
back over PCIe before a local prefill starts (``HostReload``)."""

from __future__ import annotations

from typing import Any

import pytest
from policy_fakes import KV_BYTES_PER_TOKEN, FakeView, LinearEstimator, make_request

from tokenomy.core import SLO, Role
from tokenomy.policy.ampd import AdaptivePlacement, HostReload, PlacementConfig

SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)
XFER_S_PER_TOKEN = KV_BYTES_PER_TOKEN / 25e9  # the fake estimator's KV link


def decide(reload: HostReload | None, **view: Any) -> Any:
    # 4,000 tokens of history the decode node holds, 300 new; the prefill node has 10k queued (~1 s).
    request = make_request(prompt_tokens=4300, history_tokens=4000, max_output_tokens=200)
    decode = FakeView("d", **{"num_decoding": 8, "free_blocks": 1000, "total_blocks": 1000, **view})
    prefill = FakeView("p", role=Role.PREFILL, num_waiting_tokens=10_000)
    return AdaptivePlacement(PlacementConfig(), LinearEstimator()).decide(
        request, decode=decode, prefills=[prefill], slo=SLO_, now=0.0, history_cached_tokens_on_decode=4000,
        host_reload=reload,
    )


def test_a_reload_queued_on_pcie_delays_the_local_estimate_and_sends_the_turn_remote() -> None:
    blind = decide(None)
    assert blind.local  # a 300-token local prefill beats a 1 s prefill queue
    queued = decide(HostReload(tokens=4000, ready_in_s=3.0))
    # The local prefill starts when the history is back: 3 s from now, then its own steps.
    assert queued.est_ttft_local_s == pytest.approx(3.0 + blind.est_ttft_local_s)
    assert not queued.local and queued.prefill_instance == "p"
    assert queued.reason == "remote is at least as fast"


def test_the_decode_nodes_queue_drains_while_the_history_comes_back() -> None:
    # 2,048 prompt tokens queued on the decode node: ~0.2 s at the fake's 0.1 ms per token.
    blind = decide(None, num_waiting_tokens=2048)
    short = decide(HostReload(tokens=4000, ready_in_s=0.05), num_waiting_tokens=2048)
    long = decide(HostReload(tokens=4000, ready_in_s=1.0), num_waiting_tokens=2048)
    assert short.est_ttft_local_s == pytest.approx(blind.est_ttft_local_s)  # the queue is the longer wait
    assert long.est_ttft_local_s > blind.est_ttft_local_s + 0.7  # the reload is


def test_the_free_kv_rule_counts_reloaded_history_as_held() -> None:
    # 300 new + 200 output tokens = 32 blocks; the reload's 4,000 tokens are not asked for again
    # (counting them sent turns remote that then waited for the same decode memory).
    assert decide(HostReload(tokens=4000, ready_in_s=0.0), free_blocks=40).local
    assert not decide(HostReload(tokens=4000, ready_in_s=0.0), free_blocks=20).local


def test_a_remote_prefill_sends_back_the_history_the_decode_gpu_lacks() -> None:
    blind, reloaded = decide(None), decide(HostReload(tokens=4000, ready_in_s=0.0))
    assert reloaded.est_ttft_remote_s == pytest.approx(blind.est_ttft_remote_s + 4000 * XFER_S_PER_TOKEN)


def test_nothing_to_reload_changes_nothing() -> None:
    assert decide(HostReload(tokens=0, ready_in_s=5.0)) == decide(None)


@pytest.mark.parametrize("bad", [(-1, 0.0), (10, -0.5), (10, float("nan"))])
def test_host_reload_bounds(bad: tuple[int, float]) -> None:
    with pytest.raises(ValueError, match="HostReload"):
        HostReload(*bad)
