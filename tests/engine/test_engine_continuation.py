"""Continuations (requests whose first token the client already has) jump the waiting queue."""

from __future__ import annotations

from engine_factory import create_engine, create_requests


def test_continuations_are_admitted_before_requests_that_have_not_started() -> None:
    engine = create_engine(num_gpu_blocks=64, max_num_seqs=1)
    fresh, cont = create_requests(2, prompt_tokens=64, max_output_tokens=4)
    engine.add_request(fresh, 0.0)
    engine.add_request(cont, 0.0, preloaded_tokens=64, emitted_tokens=1, continuation=True)
    result = engine.step(0.0)
    assert result is not None
    assert engine.num_running == 1 and engine.num_waiting == 1
    assert result.emitted == [cont.request_id]  # the continuation ran first; the fresh request waits


def test_continuations_keep_their_own_arrival_order() -> None:
    engine = create_engine(num_gpu_blocks=64, max_num_seqs=1)
    fresh, c1, c2 = create_requests(3, prompt_tokens=16, max_output_tokens=2)
    engine.add_request(fresh, 0.0)
    engine.add_request(c1, 0.0, preloaded_tokens=16, emitted_tokens=1, continuation=True)
    engine.add_request(c2, 0.0, preloaded_tokens=16, emitted_tokens=1, continuation=True)
    order = []
    now = 0.0
    while (res := engine.step(now)) is not None:
        order += [f.request_id for f in res.finished]
        now = res.end_s
    assert order == [c1.request_id, c2.request_id, fresh.request_id]
