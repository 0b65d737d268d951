"""AMPD's first turns at point (c) of the grid (ninth round): an idle decode instance prefills a
first turn in full steps when the prefill pool is busy (``ampd-idle-first``), and a short prompt
passes a long one computing on a prefill instance (``ampd-short-first``)."""

from __future__ import annotations

from tokenomy.core import SLO, Session, Turn
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.runner import SimResult
from tokenomy.sim.variants import make_variant

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)
SLO_ = SLO(ttft_s=10.0, tpot_s=0.05)
CFG = SimConfig(instances=2, prefill=1, decode=1)


def first_turn(sid: str, key: int, start_s: float, prompt: int, output: int = 200) -> Session:
    return Session(sid, start_s, (Turn(prompt_tokens=prompt, output_tokens=output, content=((key, prompt),)),))


def run(variant: str, sessions: list[Session]) -> SimResult:
    res = simulate(sessions, make_variant(variant, CFG), SLO_, perf=PERF)
    assert sorted(r.session_id for r in res.records) == sorted(s.session_id for s in sessions)  # each once
    for r in res.records:
        assert r.finished and r.output_tokens == r.usage.output_tokens
        r.usage.check()
    return res


def test_an_idle_decode_instance_prefills_a_first_turn_the_busy_prefill_instance_would_queue() -> None:
    # "z" (60k tokens) occupies prefill-0 for seconds; "a" arrives just after it
    sessions = [first_turn("z", 1, 0.0, 60_000), first_turn("a", 2, 0.05, 40_000)]
    off = {r.session_id: r for r in run("ampd", sessions).records}
    on = {r.session_id: r for r in run("ampd-idle-first", sessions).records}
    assert off["a"].prefill_instance == "prefill-0"  # queued behind "z"
    assert on["a"].prefill_instance in (None, "", "decode-0")  # prefilled where it decodes
    a_off, a_on, z_on = off["a"].ttft_s, on["a"].ttft_s, on["z"].ttft_s
    assert a_off is not None and a_on is not None and z_on is not None
    assert a_on < 0.7 * a_off  # no wait for "z"'s prefill
    assert z_on < off["z"].ttft_s + 0.05  # "z" lost at most a step (its first one beside "a"'s chunk)


def test_a_decode_that_joins_an_idle_instances_full_prefill_keeps_its_tpot() -> None:
    # "a" (80k tokens) is prefilled on idle decode-0 in full steps; "z"'s short prompt, prefilled on
    # prefill-0 meanwhile, then decodes on decode-0 beside it: the chunks shrink to its TPOT SLO
    sessions = [first_turn("z", 1, 0.0, 4_000, output=300), first_turn("a", 2, 0.01, 80_000)]
    # "z" goes to prefill-0 (idle, sooner); "a" would queue behind it
    recs = {r.session_id: r for r in run("ampd-idle-first", sessions).records}
    assert recs["a"].prefill_instance in (None, "", "decode-0")
    z = recs["z"]
    assert z.first_token_s is not None and recs["a"].first_token_s is not None
    assert z.first_token_s < recs["a"].first_token_s  # "z" decoded while "a" still prefilled
    assert z.max_itl_s <= SLO_.tpot_s  # every step it shared with "a"'s prefill fit its TPOT SLO
