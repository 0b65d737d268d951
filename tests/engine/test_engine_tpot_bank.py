"""``Engine.tpot_bank_s``: how long a stall each stream on the instance can take and still end
within its TPOT SLO (vLLM's TPOT: (E2E - TTFT) / (output tokens - 1), a per-request mean)."""

from __future__ import annotations

import math

from engine_factory import FakePerf, create_engine, create_requests

TPOT = 0.05


def test_a_stream_banks_the_tpot_it_has_not_used() -> None:
    perf = FakePerf(base_s=0.01)  # every step 10 ms, a fifth of the TPOT SLO
    engine = create_engine(perf)
    (req,) = create_requests(1, prompt_tokens=64, max_output_tokens=100)
    engine.add_request(req, 0.0)
    assert engine.tpot_bank_s(TPOT, 0.0) == math.inf  # no first token yet: no stream to protect
    now, tokens = 0.0, 0
    while tokens < 11:  # the first token, then 10 more, one per 10 ms step
        res = engine.step(now)
        assert res is not None
        now, tokens = res.end_s, tokens + len(res.emitted)
    first = 0.01
    assert abs(engine.tpot_bank_s(TPOT, now) - (10 * TPOT - (now - first))) < 1e-12  # 0.5 - 0.1 = 0.4 s
    # spend it: a next step of bank + one TPOT SLO leaves the stream's TPOT exactly at the SLO
    bank = engine.tpot_bank_s(TPOT, now)
    perf.base_s = bank + TPOT
    res = engine.step(now)
    assert res is not None and res.emitted == [req.request_id]
    assert abs((res.end_s - first) / 11 - TPOT) < 1e-12
    assert abs(engine.tpot_bank_s(TPOT, res.end_s)) < 1e-12  # at its SLO: nothing left in the bank


def test_a_continuation_counts_the_token_its_prefill_side_emitted() -> None:
    engine = create_engine(FakePerf(base_s=0.01))
    (req,) = create_requests(1, prompt_tokens=64, max_output_tokens=20)
    engine.add_request(req, 0.0, preloaded_tokens=64, emitted_tokens=1, continuation=True)
    res = engine.step(0.0)  # its first token here: TTFT on the client's side, not TPOT
    assert res is not None and res.emitted == [req.request_id]
    # its TPOT is (finish - this token) / (tokens here): one gap already paid for by the prefill side
    assert abs(engine.tpot_bank_s(TPOT, 0.01) - TPOT) < 1e-12
    assert abs(engine.tpot_bank_s(TPOT, 0.03) - (TPOT - 0.02)) < 1e-12


def test_the_least_bank_over_the_streams_is_reported() -> None:
    engine = create_engine(FakePerf(base_s=0.01))
    early, late = create_requests(2, prompt_tokens=64, max_output_tokens=50)
    engine.add_request(early, 0.0)
    now = 0.0
    for _ in range(20):  # "early" banks 40 ms a token
        res = engine.step(now)
        assert res is not None
        now = res.end_s
    engine.add_request(late, now)
    res = engine.step(now)  # "late"'s first token: nothing banked yet
    assert res is not None and late.request_id in res.emitted
    assert abs(engine.tpot_bank_s(TPOT, res.end_s)) < 1e-12


def test_set_chunk_cap_recaps_a_prefill_and_reports_what_it_has_left() -> None:
    perf = FakePerf(base_s=0.01)
    engine = create_engine(perf, max_num_batched_tokens=2048)
    (req,) = create_requests(1, prompt_tokens=1000, max_output_tokens=4)
    engine.add_request(req, 0.0, max_chunk_tokens=100)
    res = engine.step(0.0)
    assert res is not None and res.shape.prefill_tokens == 100
    assert engine.set_chunk_cap(req.request_id, 600) == 900
    res = engine.step(res.end_s)
    assert res is not None and res.shape.prefill_tokens == 600
    assert engine.set_chunk_cap(req.request_id, 0) == 300  # 0: no cap of its own
    res = engine.step(res.end_s)
    assert res is not None and res.shape.prefill_tokens == 300
    assert engine.set_chunk_cap(req.request_id, 50) == 0  # decoding: nothing left to cap
    assert engine.set_chunk_cap("absent", 50) == 0


def test_the_bank_counts_an_open_decode_runs_applied_steps_and_the_step_in_flight() -> None:
    engine = create_engine(FakePerf(base_s=0.01))
    (req,) = create_requests(1, prompt_tokens=64, max_output_tokens=100)
    engine.add_request(req, 0.0)
    res = engine.step(0.0)  # first token at 0.01
    assert res is not None
    # mid-step, the bank is read at the step's end, when the next step can start
    mid = engine.step(res.end_s)  # second token at 0.02
    assert mid is not None
    assert abs(engine.tpot_bank_s(TPOT, 0.015) - (TPOT - 0.01)) < 1e-12
    run = engine.plan_decode_run(mid.end_s, max_steps=50)
    assert run is not None
    assert engine.advance_decode_run(0.1) == 9  # the steps starting at 0.02, ..., 0.1: tokens to 0.11
    # 1 + 9 tokens after the first, the last at 0.11: the same as single steps would show
    assert abs(engine.tpot_bank_s(TPOT, 0.1) - (10 * TPOT - (0.11 - 0.01))) < 1e-9
    engine.close_decode_run(0.1)
    assert abs(engine.tpot_bank_s(TPOT, 0.11) - (10 * TPOT - 0.10)) < 1e-9
