from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from tokenomy.core import SLO, RequestRecord, TokenUsage
from tokenomy.metrics import Summary, summarize

from .factories import make_record

SLO_1S = SLO(ttft_s=1.0, tpot_s=0.1)


def _summ(records: list[RequestRecord], **kwargs: Any) -> Summary:
    args: dict = {"slo": SLO_1S, "duration_s": 10.0, "num_gpus": 1, "usd_per_gpu_hour": 0.0}
    args.update(kwargs)
    return summarize(records, **args)


def test_tpot_excludes_first_token() -> None:
    # TTFT 2 s, then 10 more tokens 0.1 s apart: finish at 3 s. TPOT is 1 s / 10 = 0.1, not 3/11.
    rec = RequestRecord("a", arrival_s=0.0, first_token_s=2.0, finish_s=3.0, prompt_tokens=5, output_tokens=11)
    s = _summ([rec])
    assert s.tpot_p50_s == pytest.approx(0.1)
    assert s.ttft_p50_s == pytest.approx(2.0)
    assert s.e2e_p50_s == pytest.approx(3.0)


def test_one_token_answers_have_no_tpot_but_can_meet_slo() -> None:
    s = _summ([make_record(output_tokens=1, ttft_s=0.2)])
    assert s.tpot_p50_s is None
    assert s.slo_attainment == 1.0


@pytest.mark.parametrize(
    ("records", "attainment", "met"),
    [
        pytest.param([make_record("a"), make_record("b")], 1.0, 2, id="all-meet"),
        pytest.param([make_record("a"), make_record("b", ttft_s=1.5)], 0.5, 1, id="late-first-token"),
        pytest.param([make_record("a"), make_record("b", tpot_s=0.2)], 0.5, 1, id="slow-decode"),
        # Unfinished requests are misses even though what they produced was fast.
        pytest.param([make_record("a"), make_record("b", finished=False), make_record("c", ttft_s=None)],
                     1 / 3, 1, id="unfinished-are-misses"),
    ],
)
def test_slo_attainment(records: list[RequestRecord], attainment: float, met: int) -> None:
    s = _summ(records)
    assert s.slo_attainment == pytest.approx(attainment)
    assert s.slo_met == met
    assert s.goodput_rps == pytest.approx(met / 10.0)


def test_unfinished_request_counts_in_ttft_but_not_e2e() -> None:
    s = _summ([make_record("a", ttft_s=0.1), make_record("b", ttft_s=0.3, finished=False)])
    assert s.requests == 2 and s.finished == 1
    assert s.ttft_p50_s == pytest.approx(0.2)
    assert s.e2e_p99_s == pytest.approx(0.1 + 0.05 * 10)


def test_cost_per_million_tokens_by_hand() -> None:
    # 8 GPUs x $2/h over one hour = $16 for 16e6 tokens (12e6 prompt + 4e6 output) -> $1 per M.
    recs = [make_record(f"r{i}", prompt_tokens=3_000_000, output_tokens=1_000_000) for i in range(4)]
    s = _summ(recs, duration_s=3600.0, num_gpus=8, usd_per_gpu_hour=2.0)
    assert s.cost_usd == pytest.approx(16.0)
    assert s.cost_per_mtok_usd == pytest.approx(1.0)
    assert s.cost_per_mtok_output_usd == pytest.approx(4.0)
    assert s.tpm == pytest.approx(16e6 / 60)
    assert s.output_tps == pytest.approx(4e6 / 3600)
    assert s.rpm == pytest.approx(4 / 60)


def test_mfu_by_hand() -> None:
    # 4 GPUs of 1e15 FLOP/s each for 10 s could do 4e16 FLOPs; 1e16 useful -> 25%.
    s = _summ([make_record()], num_gpus=4, total_flops=1e16, peak_flops_per_s=4 * 1e15)
    assert s.mfu == pytest.approx(0.25)
    assert s.goodput_per_gpu_rps == pytest.approx(0.1 / 4)


def test_token_classes_are_summed() -> None:
    u1 = TokenUsage(input_tokens=100, output_tokens=10, recomputed_tokens=100)
    u2 = TokenUsage(incremental_prefill_tokens=20, history_tokens=110, output_tokens=5,
                    cache_hit_tokens=110, recomputed_tokens=20, transferred_tokens=30)
    s = _summ([make_record("a", usage=u1), make_record("b", session_id="s", turn=1, usage=u2)])
    assert s.tokens == {
        "input_tokens": 100, "incremental_prefill_tokens": 20, "history_tokens": 110,
        "output_tokens": 15, "cache_hit_tokens": 110, "recomputed_tokens": 120,
        "transferred_tokens": 30, "preempted_recompute_tokens": 0, "prompt_tokens": 230,
    }


def test_itl_uses_pooled_samples_weighted_by_tokens() -> None:
    # 99 tokens at 10 ms, one stall of 1 s that delayed 1 token: P50 10 ms, P99 interpolated.
    s = _summ([make_record()], itl_values=[0.01, 1.0], itl_weights=[99, 1])
    assert s.itl_p50_s == pytest.approx(0.01)
    assert s.itl_p99_s == pytest.approx(0.01 + 0.01 * (1.0 - 0.01))
    assert s.itl_mean_s == pytest.approx((99 * 0.01 + 1.0) / 100)


def test_itl_falls_back_to_tpot() -> None:
    s = _summ([make_record(tpot_s=0.04)])
    assert s.itl_p50_s == pytest.approx(0.04)


def test_p99_ttft_among_tpot_met_turns_leaves_out_the_turns_that_spent_tpot() -> None:
    # 99 turns meet TPOT with TTFTs of 0.01 .. 0.99 s; one fast-first-token turn missed TPOT and a
    # slow one (5 s TTFT) missed it too: neither counts. An unfinished turn has no TPOT: not counted.
    met = [make_record(f"m{i}", ttft_s=0.01 * (i + 1), tpot_s=0.05) for i in range(99)]
    spent = [make_record("fast", ttft_s=0.001, tpot_s=0.2), make_record("slow", ttft_s=5.0, tpot_s=0.15)]
    s = _summ([*met, *spent, make_record("cut", ttft_s=9.0, finished=False)])
    ttfts = [0.01 * (i + 1) for i in range(99)]
    assert s.ttft_p99_tpot_met_s == pytest.approx(float(np.percentile(ttfts, 99)))
    assert s.ttft_p99_s is not None and s.ttft_p99_s > 4.0  # the all-turns P99 sees the slow ones
    # a turn exactly at the TPOT bound met it; a one-token answer has no TPOT to miss
    at_bound = _summ([make_record("b", ttft_s=0.7, tpot_s=0.1), make_record("one", ttft_s=0.3, output_tokens=1)])
    assert at_bound.ttft_p99_tpot_met_s == pytest.approx(float(np.percentile([0.3, 0.7], 99)))
    assert _summ([make_record("x", tpot_s=0.2)]).ttft_p99_tpot_met_s is None  # no turn met TPOT
    assert _summ([]).to_dict()["ttft_p99_tpot_met_s"] is None


def test_empty_input_gives_zeros_and_strict_json() -> None:
    s = summarize([], slo=SLO_1S, duration_s=0.0, num_gpus=1, usd_per_gpu_hour=2.0)
    d = s.to_dict()
    text = json.dumps(d, allow_nan=False)  # raises on NaN or infinity
    assert d["requests"] == 0 and d["slo_attainment"] == 0.0 and d["goodput_rps"] == 0.0
    assert d["ttft_p50_s"] is None and d["tpot_p99_s"] is None and d["cost_per_mtok_usd"] is None
    assert json.loads(text) == d


def test_to_dict_has_the_documented_keys() -> None:
    d = _summ([make_record()]).to_dict()
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "slo_attainment", "goodput_rps",
                "cost_per_mtok_usd", "mfu", "tokens", "rpm", "tpm", "e2e_p99_s", "itl_p99_s", "num_gpus"):
        assert key in d
    assert all(not (isinstance(v, float) and math.isnan(v)) for v in d.values())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_gpus": 0}, "num_gpus"),
        ({"duration_s": 0.0}, "duration_s must be positive"),
        ({"usd_per_gpu_hour": -1.0}, "usd_per_gpu_hour"),
        ({"duration_s": float("nan")}, "duration_s"),
        ({"itl_values": [0.1], "itl_weights": [1.0, 2.0]}, "1 itl_values but 2 itl_weights"),
    ],
)
def test_bad_arguments_get_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _summ([make_record()], **kwargs)
