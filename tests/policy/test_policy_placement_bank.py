"""A local prefill sized to the decode batch's banked TPOT slack (``PlacementConfig.tpot_bank``).

With ``LinearEstimator`` a step takes 10 ms + 0.1 ms per prefill token + 0.1 ms per decode, the
TPOT SLO is 50 ms, and the decode node runs one decode: a 256-token chunk is the largest (of
512, 256, ...) whose step fits the ITL bound."""

from __future__ import annotations

import math
from typing import Any

from policy_fakes import FakeView, LinearEstimator, make_request

from tokenomy.core import SLO, Role
from tokenomy.policy.ampd import AdaptivePlacement, PlacementConfig, PlacementDecision

SLO_ = SLO(ttft_s=10.0, tpot_s=0.05)
NEW = 10_000  # an increment of 10k tokens after 20k of history held on the decode node
DECODE = FakeView("d", num_running=1, num_decoding=1, decode_context_tokens=4_000, free_blocks=10_000,
                  total_blocks=10_000)
BUSY_PREFILL = FakeView("p", role=Role.PREFILL, num_waiting_tokens=40_000)


def decide(bank_s: float | None, *, history: int = 20_000, decode: FakeView = DECODE,
           prefill: FakeView = BUSY_PREFILL, **overrides: Any) -> PlacementDecision:
    config = PlacementConfig(local_budget_tokens=512, size_local_chunks=True, **{"tpot_bank": True, **overrides})
    return AdaptivePlacement(config, LinearEstimator()).decide(
        make_request(prompt_tokens=history + NEW, history_tokens=history), decode=decode, prefills=[prefill],
        slo=SLO_, now=0.0, history_cached_tokens_on_decode=history, tpot_bank_s=bank_s,
    )


def test_a_batch_at_its_tpot_slo_gets_the_itl_sized_chunk() -> None:
    without = decide(None)
    at_slo = decide(0.0)  # nothing banked: a step may not exceed the ITL bound
    assert without.local and at_slo.local
    assert at_slo.chunk_tokens == without.chunk_tokens == 256
    assert at_slo.est_ttft_local_s == without.est_ttft_local_s


def test_a_batch_ahead_of_its_tpot_gets_a_larger_chunk_and_a_sooner_estimate() -> None:
    chunks = {bank: decide(bank) for bank in (0.0, 0.5, 2.0)}
    # 0.5 s banked, less the margin (one TPOT SLO): 20 steps of 512 tokens exceed 50 ms by 11.3 ms
    # each (0.23 s in all); 10 steps of 1024 by 62.5 ms each (0.63 s): too much
    assert chunks[0.5].chunk_tokens == 512
    # 2 s banked: two steps of 8192 tokens (the prefill budget) exceed it by 0.78 s each
    assert chunks[2.0].chunk_tokens == PlacementConfig().prefill_budget_tokens
    ttfts = [chunks[b].est_ttft_local_s for b in (0.0, 0.5, 2.0)]
    assert ttfts[0] > ttfts[1] > ttfts[2]  # fewer steps, each carrying the decode once
    assert all(chunks[b].itl_slack_s >= 0 for b in chunks)
    # the bank left after the prefill is what the decision reports
    assert abs(chunks[2.0].itl_slack_s - (2.0 - 0.05 - 2 * (chunks[2.0].est_itl_local_s - 0.05))) < 1e-9


def test_the_margin_is_kept_out_of_the_bank() -> None:
    # 1.6 s would pay the two 8192-token steps' 1.56 s, but not with one TPOT SLO kept back
    assert decide(1.6).chunk_tokens < PlacementConfig().prefill_budget_tokens
    assert decide(1.6, tpot_bank_margin=0.0).chunk_tokens == PlacementConfig().prefill_budget_tokens


def test_the_bank_is_ignored_unless_the_switch_is_on() -> None:
    assert decide(2.0, tpot_bank=False).chunk_tokens == 256


def test_a_first_turn_goes_to_a_decode_node_with_banked_slack_while_the_prefill_pool_queues() -> None:
    idle = FakeView("d", free_blocks=10_000, total_blocks=10_000)
    queued = FakeView("p", role=Role.PREFILL, num_waiting_tokens=2_000)  # 0.2 s, then 1.0 s of prefill
    first = decide(math.inf, history=0, decode=idle, prefill=queued)  # no stream on it: nothing to protect
    assert first.local and first.chunk_tokens == PlacementConfig().prefill_budget_tokens
    assert first.est_ttft_local_s < first.est_ttft_remote_s  # two full steps, no queue, no transfer
    # with nothing banked it would prefill in 40 steps of 256 tokens (1.4 s): remote is sooner
    slow = decide(0.0, history=0, prefill=queued)
    assert not slow.local and slow.est_ttft_local_s > slow.est_ttft_remote_s
    # an idle prefill pool keeps its first turns (the decode node would save only the transfer)
    assert not decide(math.inf, history=0, decode=idle, prefill=FakeView("p", role=Role.PREFILL)).local
