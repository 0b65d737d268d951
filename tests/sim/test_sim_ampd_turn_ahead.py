"""A later turn that would queue behind prefill work on its bound decode instance moves, history
and all, to one that starts it sooner (``AMPDOptions.move_queued_turns``, on in ``ampd``); and the
forward-looking TPOT bank, a young stream counting the tokens it is still expected to emit
(``ampd-forward-bank``, an option)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tokenomy.core import SLO, Request, Session, Turn
from tokenomy.engine.request_state import RequestState
from tokenomy.engine.tpot_bank import tpot_bank_s
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import make_variant

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)


def test_a_turn_queued_behind_a_prefill_moves_to_an_idle_instance_and_its_history_follows() -> None:
    # "x" and "w" are bound to decode-0, "y" to decode-1. "w"'s second turn brings 60k new tokens
    # to decode-0 just before "x"'s second turn, while decode-1 has nothing queued.
    x = Session("x", 0.0, (Turn(prompt_tokens=1_000, output_tokens=20, content=((1, 1_020),)),
                           Turn(prompt_tokens=6_020, output_tokens=20, history_tokens=1_020, think_time_s=3.0,
                                content=((1, 6_040),))))
    y = Session("y", 0.01, (Turn(prompt_tokens=5_000, output_tokens=20, content=((2, 5_020),)),))
    w = Session("w", 0.02, (Turn(prompt_tokens=1_000, output_tokens=20, content=((3, 1_020),)),
                            Turn(prompt_tokens=61_020, output_tokens=20, history_tokens=1_020, think_time_s=2.9,
                                 content=((3, 61_040),))))
    cfg = SimConfig(deployment="ampd", instances=2, prefill=0, decode=2)

    def run(move: bool) -> tuple[dict[tuple[str, int], Any], list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []
        config = make_variant("ampd", cfg)
        config = replace(config, ampd=replace(config.ampd, move_queued_turns=move))
        res = simulate([x, y, w], config, SLO(2.0, 0.1), perf=PERF, decision_trace=events.append)
        for r in res.records:
            assert r.finished
            r.usage.check()
        return {(r.session_id, r.turn): r for r in res.records}, events

    off, _ = run(False)
    on, events = run(True)
    assert off[("x", 1)].decode_instance == "decode-0" and off[("x", 1)].ttft_s > 3.0  # queued behind "w"
    moved = on[("x", 1)]
    assert moved.decode_instance == "decode-1" and moved.ttft_s < 0.5
    # its history came along over the KV link (whole 16-token blocks of it): only the rest was computed
    assert moved.usage.cache_hit_tokens == 1_008 == moved.usage.history_tokens // 16 * 16
    assert moved.usage.recomputed_tokens == 6_020 - 1_008
    move = [e for e in events if e["kind"] == "binding" and e["session_id"] == "x" and e["rebound"]]
    assert len(move) == 1 and move[0]["move_history"] and move[0]["from_instance"] == "decode-0"
    assert on[("w", 1)].decode_instance == "decode-0"  # the turn in front stays where its history is


def _bank(num_tokens: int) -> float:
    s = RequestState(Request("r", 0.0, 100, 1_000), 0, chain=None, preloaded_tokens=0, emitted_tokens=0,
                     prefill_only=False)
    s.first_token_s, s.num_tokens = 0.0, num_tokens
    return tpot_bank_s([s], at=1.0, ran=0, tpot_s=0.1, expected_tokens=100, itl_s=0.04)


def test_the_forward_bank_counts_only_the_tokens_a_stream_is_still_expected_to_emit() -> None:
    # 11 tokens after its first in 1 s: its own bank is 11 * 0.1 - 1 = 0.1 s; it is expected to emit
    # 100 - 12 = 88 more at 40 ms, each leaving 60 ms of its SLO: 5.28 s more
    assert _bank(num_tokens=100 + 12) == pytest.approx(0.1 + 88 * 0.06)
    assert _bank(num_tokens=100 + 150) == pytest.approx(149 * 0.1 - 1.0)  # past the quantile: its own bank only


def _sessions(warm_output_tokens: int) -> list[Session]:
    # 60 short turns finish first (the output lengths the forward bank learns), then "y" starts
    # streaming on the one decode instance and "x"'s 30k-token increment arrives there.
    warm = [Session(f"w{i}", 0.01 * i, (Turn(prompt_tokens=200, output_tokens=warm_output_tokens,
                                              content=((100 + i, 200 + warm_output_tokens),)),)) for i in range(60)]
    y = Session("y", 5.0, (Turn(prompt_tokens=1_000, output_tokens=400, content=((2, 1_400),)),))
    x = Session("x", 0.0, (Turn(prompt_tokens=1_000, output_tokens=5, content=((3, 1_005),)),
                           Turn(prompt_tokens=31_005, output_tokens=20, history_tokens=1_005, think_time_s=5.3,
                                content=((3, 31_025),))))
    return [*warm, y, x]


@pytest.mark.parametrize("warm_output_tokens", [100, 5])
def test_a_young_stream_lends_its_forward_slack_to_a_local_prefill_only_when_it_has_some(
    warm_output_tokens: int
) -> None:
    slo = SLO(ttft_s=10.0, tpot_s=0.025)
    cfg = SimConfig(deployment="ampd", instances=1, prefill=0, decode=1)

    def run(variant: str) -> dict[str, Any]:
        res = simulate(_sessions(warm_output_tokens), make_variant(variant, cfg), slo, perf=PERF)
        assert all(r.finished for r in res.records)
        recs = {(r.session_id, r.turn): r for r in res.records}
        return {"y": recs[("y", 0)], "inc": recs[("x", 1)]}

    bank, ahead = run("ampd"), run("ampd-forward-bank")
    if warm_output_tokens == 100:  # "y" is expected to stream ~100 tokens at ~13 ms: slack to lend
        assert ahead["inc"].ttft_s < bank["inc"].ttft_s - 0.05  # larger chunks beside "y"
        assert ahead["y"].max_itl_s > bank["y"].max_itl_s  # "y" stalled longer ...
    else:  # turns end after 5 tokens: no forward slack, the same chunks as the streams' own bank
        assert ahead["inc"].ttft_s == bank["inc"].ttft_s and ahead["y"].max_itl_s == bank["y"].max_itl_s
    assert ahead["y"].tpot_s <= slo.tpot_s  # ... and its TPOT still meets the SLO
