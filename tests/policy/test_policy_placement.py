"""Adaptive placement of (incremental) prefills: local versus remote, on hand-built views."""

from __future__ import annotations

import math
from typing import Any

import pytest
from policy_fakes import KV_BYTES_PER_TOKEN, FakeView, LinearEstimator, make_request

from tokenomy.core import SLO, Request, Role
from tokenomy.policy.ampd import AdaptivePlacement, PlacementConfig

SLO_ = SLO(ttft_s=2.0, tpot_s=0.1)
XFER_S_PER_TOKEN = KV_BYTES_PER_TOKEN / 25e9


def placement(**overrides: Any) -> AdaptivePlacement:
    return AdaptivePlacement(PlacementConfig(**overrides), LinearEstimator())


def prefill(instance_id: str, waiting_tokens: int, cached: int = 0) -> FakeView:
    return FakeView(instance_id, role=Role.PREFILL, num_waiting_tokens=waiting_tokens, cached_tokens=cached)


def incremental(new_tokens: int = 300, history: int = 4000, arrival_s: float = 0.0) -> Request:
    return make_request(prompt_tokens=history + new_tokens, history_tokens=history, arrival_s=arrival_s)


@pytest.mark.parametrize("prefill_waiting_tokens", [30_000, 100_000])
@pytest.mark.parametrize("num_decoding", [0, 16, 200])
def test_local_when_prefill_queues_are_long_and_decode_has_itl_slack(
    prefill_waiting_tokens: int, num_decoding: int
) -> None:
    decode = FakeView("d", num_decoding=num_decoding, decode_context_tokens=2000 * num_decoding)
    prefills = [prefill("p1", prefill_waiting_tokens), prefill("p2", prefill_waiting_tokens + 5000)]
    d = placement().decide(
        incremental(),
        decode=decode,
        prefills=prefills,
        slo=SLO_,
        now=0.0,
        history_cached_tokens_on_decode=4000,
    )
    assert d.local and d.prefill_instance is None
    assert d.ttft_slack_s < 0 < d.itl_slack_s
    assert d.est_ttft_local_s < d.est_ttft_remote_s


@pytest.mark.parametrize("num_decoding", [650, 900])
@pytest.mark.parametrize("new_tokens", [300, 2000])
def test_remote_when_decode_node_is_near_its_itl_slo(num_decoding: int, new_tokens: int) -> None:
    decode = FakeView("d", num_decoding=num_decoding)
    # prefill queues long enough that remote misses TTFT: the decode node is still protected
    prefills = [prefill("p1", 100_000), prefill("p2", 60_000)]
    d = placement().decide(
        incremental(new_tokens),
        decode=decode,
        prefills=prefills,
        slo=SLO_,
        now=0.0,
        history_cached_tokens_on_decode=4000,
    )
    assert not d.local and d.prefill_instance == "p2"
    assert d.itl_slack_s < 0
    assert d.est_itl_local_s > SLO_.tpot_s


def test_remote_when_it_is_faster() -> None:
    # 20k prompt tokens queued on the decode node make local slow; an idle prefill node is faster
    decode = FakeView("d", num_decoding=16, num_waiting_tokens=20_000)
    d = placement().decide(
        incremental(), decode=decode, prefills=[prefill("p1", 0)], slo=SLO_, now=0.0,
        history_cached_tokens_on_decode=4000,
    )  # fmt: skip
    assert not d.local and d.prefill_instance == "p1"
    assert d.est_ttft_remote_s < d.est_ttft_local_s


def test_remote_estimate_adds_wait_history_transfer_prefill_and_transfer_back() -> None:
    p1 = prefill("p1", 8192)  # lacks the history: gets it from the decode node
    p2 = prefill("p2", 16384, cached=4000)  # has the history cached but a longer queue
    d = placement().decide(
        incremental(arrival_s=10.0), decode=FakeView("d", num_decoding=900), prefills=[p1, p2], slo=SLO_,
        now=11.5, history_cached_tokens_on_decode=4000,
    )  # fmt: skip
    p1_s = 0.8192 + 4000 * XFER_S_PER_TOKEN + 300 * 1e-4 + 300 * XFER_S_PER_TOKEN
    assert d.prefill_instance == "p1"
    assert d.est_ttft_remote_s == pytest.approx(1.5 + p1_s)  # includes the 1.5 s already waited
    assert d.ttft_slack_s == pytest.approx(SLO_.ttft_s - 1.5 - p1_s)


def test_measured_queue_delay_overrides_the_estimate() -> None:
    p1, p2 = prefill("p1", 0), prefill("p2", 0)
    d = placement().decide(
        incremental(), decode=FakeView("d", num_decoding=900), prefills=[p1, p2], slo=SLO_, now=0.0,
        history_cached_tokens_on_decode=4000, prefill_queue_delay_s={"p1": 5.0},
    )  # fmt: skip
    assert d.prefill_instance == "p2"
    with pytest.raises(ValueError, match="prefill_queue_delay_s"):
        placement().decide(
            incremental(), decode=FakeView("d"), prefills=[p1], slo=SLO_, now=0.0,
            history_cached_tokens_on_decode=0, prefill_queue_delay_s={"p1": -1.0},
        )  # fmt: skip


def test_local_prefill_is_chunked_by_the_decode_budget() -> None:
    # 5000 new tokens in chunks of the 2048-token prefill budget, each step beside 32 decodes
    decode = FakeView("d", num_decoding=32)
    d = placement().decide(
        incremental(new_tokens=5000), decode=decode, prefills=[prefill("p1", 0)], slo=SLO_, now=0.0,
        history_cached_tokens_on_decode=4000,
    )  # fmt: skip
    steps = [0.01 + n * 1e-4 + 32 * 1e-4 for n in (2048, 2048, 904)]
    assert d.est_itl_local_s == pytest.approx(max(steps))
    assert d.est_ttft_local_s == pytest.approx(sum(steps))
    assert not d.local  # a 0.21 s step breaks the 0.1 s ITL bound


def test_local_chunk_is_sized_to_the_itl_slack() -> None:
    # 2048- and 1024-token chunks beside 32 decodes break the 0.1 s bound; 512 fits (0.064 s):
    # the prefill goes local in 512-token chunks (9 full, then 392) instead of remote past TTFT.
    decode = FakeView("d", num_decoding=32)
    d = placement(size_local_chunks=True).decide(
        incremental(new_tokens=5000), decode=decode, prefills=[prefill("p1", 100_000)], slo=SLO_, now=0.0,
        history_cached_tokens_on_decode=4000,
    )  # fmt: skip
    full, last = 0.01 + 512e-4 + 32e-4, 0.01 + 392e-4 + 32e-4
    assert d.local and d.chunk_tokens == 512
    assert d.est_itl_local_s == pytest.approx(full) and d.itl_slack_s > 0
    assert d.est_ttft_local_s == pytest.approx(9 * full + last)
    # the same decision without sizing: one 2048-token chunk breaks ITL, so it goes remote
    fixed = placement().decide(
        incremental(new_tokens=5000), decode=decode, prefills=[prefill("p1", 100_000)], slo=SLO_, now=0.0,
        history_cached_tokens_on_decode=4000,
    )  # fmt: skip
    assert not fixed.local and fixed.chunk_tokens == 0


def test_no_chunk_fits_a_decode_batch_at_its_itl_bound() -> None:
    # 900 decodes alone take 0.1 s: even a 16-token chunk breaks the bound, so remote
    d = placement(size_local_chunks=True).decide(
        incremental(), decode=FakeView("d", num_decoding=900), prefills=[prefill("p1", 100_000)], slo=SLO_,
        now=0.0, history_cached_tokens_on_decode=4000,
    )  # fmt: skip
    assert not d.local and d.itl_slack_s < 0
    assert d.est_itl_local_s == pytest.approx(0.01 + 16e-4 + 900e-4)


@pytest.mark.parametrize(
    ("prefill_waiting", "decode_waiting", "expected_local"),
    [
        (8192, 0, False),  # remote meets TTFT: first turns go remote even if local is faster
        (100_000, 0, True),  # every prefill node misses TTFT, local meets it
        (100_000, 50_000, False),  # both miss: stays remote
    ],
)
def test_first_turn(prefill_waiting: int, decode_waiting: int, expected_local: bool) -> None:
    decode = FakeView("d", num_decoding=8, num_waiting_tokens=decode_waiting)
    d = placement().decide(
        make_request(prompt_tokens=300), decode=decode, prefills=[prefill("p1", prefill_waiting)], slo=SLO_,
        now=0.0, history_cached_tokens_on_decode=0,
    )  # fmt: skip
    assert d.local is expected_local


def test_no_prefill_instance_means_local() -> None:
    d = placement().decide(
        incremental(),
        decode=FakeView("d"),
        prefills=[],
        slo=SLO_,
        now=0.0,
        history_cached_tokens_on_decode=4000,
    )
    assert d.local and d.est_ttft_remote_s == math.inf


@pytest.mark.parametrize(
    "bad",
    [{"local_budget_tokens": 0}, {"itl_bound_factor": 0.0}, {"link_bytes_per_s": -1.0},
     {"min_local_chunk_tokens": 0}, {"local_budget_tokens": 64, "min_local_chunk_tokens": 128}],
)
def test_config_bounds(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PlacementConfig(**bad)


def test_negative_history_is_rejected() -> None:
    with pytest.raises(ValueError, match="history_cached_tokens_on_decode"):
        placement().decide(
            incremental(),
            decode=FakeView("d"),
            prefills=[],
            slo=SLO_,
            now=0.0,
            history_cached_tokens_on_decode=-1,
        )


def test_remote_when_the_decode_node_has_no_free_kv_for_the_request() -> None:
    from policy_fakes import FakeView, LinearEstimator, make_request

    from tokenomy.core import SLO
    from tokenomy.policy.ampd import AdaptivePlacement, PlacementConfig

    req = make_request(prompt_tokens=4300, history_tokens=4000, max_output_tokens=200)
    placement = AdaptivePlacement(PlacementConfig(), LinearEstimator())
    busy_prefill = FakeView("p0", num_waiting_tokens=200_000)
    roomy = FakeView("d0", free_blocks=1000)
    full = FakeView("d0", free_blocks=10)
    kw = {"prefills": [busy_prefill], "slo": SLO(), "now": 0.0, "history_cached_tokens_on_decode": 4000}
    assert placement.decide(req, decode=roomy, **kw).local  # type: ignore[arg-type]
    decision = placement.decide(req, decode=full, **kw)  # type: ignore[arg-type]
    assert not decision.local and "KV" in decision.reason


def test_backlog_beyond_the_engine_queue_prices_the_remote_wait() -> None:
    # 40k tokens queued in front of p1's engine (its view shows none): 4 s at 0.1 ms per token
    decode = FakeView("d", num_decoding=16, decode_context_tokens=32_000)
    prefills = [prefill("p1", 0)]
    kwargs: dict[str, Any] = dict(decode=decode, prefills=prefills, slo=SLO_, now=0.0, history_cached_tokens_on_decode=0)
    idle = placement().decide(incremental(history=0), **kwargs)
    busy = placement().decide(incremental(history=0), prefill_backlog_tokens={"p1": 40_000}, **kwargs)
    assert busy.est_ttft_remote_s == pytest.approx(idle.est_ttft_remote_s + 4.0)



def test_a_late_increment_goes_to_the_faster_side() -> None:
    # Every prefill node misses TTFT (60k tokens queued: ~6 s), and a 40k-token recompute on
    # the decode node takes longer still (~12 s in 64-token chunks): remote keeps the tail shorter.
    decode = FakeView("d", num_decoding=8, free_blocks=10_000, total_blocks=10_000)
    request = incremental(new_tokens=40_000, history=4000)
    kwargs: dict[str, Any] = dict(decode=decode, prefills=[prefill("p1", 60_000)], slo=SLO_, now=0.0,
                                  history_cached_tokens_on_decode=0)
    d = placement(local_budget_tokens=64).decide(request, **kwargs)
    assert d.ttft_slack_s < 0 and d.itl_slack_s >= 0 and d.est_ttft_local_s > d.est_ttft_remote_s
    assert not d.local and d.reason == "remote is at least as fast"
