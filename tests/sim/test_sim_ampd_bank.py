"""A local prefill in chunks the decode batch's banked TPOT slack allows (``ampd``; without the
bank, ``ampd-itl-bound``, every step stays within the ITL bound): a
running decode that is ahead of its TPOT lends that lead to a neighbour's prefill, and its own
TPOT (vLLM's per-request mean) still meets the SLO."""

from __future__ import annotations

from tokenomy.core import SLO, Session, Turn
from tokenomy.engine.trace import ListTrace
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.runner import SimResult
from tokenomy.sim.variants import make_variant

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)
SLO_ = SLO(ttft_s=10.0, tpot_s=0.025)
CFG = SimConfig(instances=2, prefill=1, decode=1)
NEW = 30_000  # the increment: 30k new tokens after a 1k-token first turn


def sessions() -> list[Session]:
    # "d" decodes 3,000 tokens on decode-0 at ~10 ms a token: it banks ~15 ms a token
    d = Session("d", 0.0, (Turn(prompt_tokens=2_000, output_tokens=3_000, content=((1, 5_000),)),))
    # "x"'s second turn (2 s after its first) brings 30k new tokens to the same decode instance
    x = Session("x", 0.0, (
        Turn(prompt_tokens=1_000, output_tokens=5, content=((2, 1_005),)),
        Turn(prompt_tokens=1_005 + NEW, output_tokens=20, history_tokens=1_005, think_time_s=2.0,
             content=((2, 1_005 + NEW + 20),)),
    ))
    # "z", a 60k-token first turn, keeps prefill-0 busy when "x"'s increment arrives
    z = Session("z", 1.9, (Turn(prompt_tokens=60_000, output_tokens=20, content=((3, 60_020),)),))
    return [d, x, z]


def run(variant: str) -> SimResult:
    res = simulate(sessions(), make_variant(variant, CFG), SLO_, perf=PERF)
    assert len(res.records) == 4 and all(r.finished for r in res.records)
    for r in res.records:
        r.usage.check()
    return res


def test_a_decode_ahead_of_its_tpot_pays_for_a_larger_local_chunk_and_keeps_its_tpot() -> None:
    off = {(r.session_id, r.turn): r for r in run("ampd-itl-bound").records}
    on = {(r.session_id, r.turn): r for r in run("ampd").records}
    inc_off, inc_on = off[("x", 1)], on[("x", 1)]
    assert inc_on.prefill_instance in (None, "", "decode-0")  # prefilled where it decodes
    assert inc_off.ttft_s is not None and inc_on.ttft_s is not None
    assert inc_on.ttft_s < 0.75 * inc_off.ttft_s  # 1.27 s, full-size chunks, against 1.89 s in ITL-sized ones
    d_off, d_on = off[("d", 0)], on[("d", 0)]
    assert d_off.max_itl_s <= SLO_.tpot_s  # without the bank no step beside it exceeds the ITL bound
    assert d_on.max_itl_s > 2 * SLO_.tpot_s  # with it, steps carrying large chunks ran beside "d" ...
    tpot = d_on.tpot_s
    assert tpot is not None and tpot <= SLO_.tpot_s  # ... and its TPOT still meets the SLO


def test_a_stream_that_joins_mid_prefill_shrinks_the_chunk_to_its_own_bank() -> None:
    # "j" (a short first turn, prefilled on the idle prefill-0) starts decoding on decode-0 while
    # "x"'s increment runs there in banked 8192-token steps (~0.4 s each). "j" has banked nothing,
    # so its next step must fit the TPOT SLO; later steps may spend only what "j" banks meanwhile
    d, x, _ = sessions()
    j = Session("j", 2.3, (Turn(prompt_tokens=2_000, output_tokens=200, content=((4, 2_200),)),))
    trace = ListTrace()
    res = simulate([d, x, j], make_variant("ampd", CFG), SLO_, perf=PERF, trace=trace)
    recs = {(r.session_id, r.turn): r for r in res.records}
    inc, joiner = recs[("x", 1)], recs[("j", 0)]
    assert joiner.prefill_instance == "prefill-0" and joiner.decode_instance == "decode-0"
    first, end = joiner.first_token_s, joiner.finish_s
    assert first is not None and end is not None and inc.first_token_s is not None
    assert first < inc.first_token_s  # "j" decoded beside the increment's prefill
    steps = [e for e in trace.events if e["kind"] == "step" and e["instance"] == "decode-0"
             and first - 1e-9 <= e["t_s"] < end - 1e-9]
    assert steps[0]["prefill_tokens"] > 0 and steps[0]["duration_s"] <= SLO_.tpot_s  # ITL-sized at once
    assert max(e["duration_s"] for e in steps) > SLO_.tpot_s  # later, steps spent what "j" banked
    # after each of its tokens, "j"'s TPOT so far meets the SLO: wherever it ended, it met its SLO
    for k, e in enumerate(steps, start=1):
        assert (e["t_s"] + e["duration_s"] - first) / k <= SLO_.tpot_s + 1e-12
    tpot = joiner.tpot_s
    assert tpot is not None and tpot <= SLO_.tpot_s
