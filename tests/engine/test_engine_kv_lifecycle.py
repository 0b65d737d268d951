"""Eviction order, preemption by recompute, retention pins, abort."""

from __future__ import annotations

import pytest
from engine_factory import create_engine, create_requests, run

from tokenomy.core import Request


def test_least_recently_freed_blocks_are_evicted_first() -> None:
    engine = create_engine(num_gpu_blocks=8)
    a = Request("a", 0.0, 64, 1, content=((1, 64),))  # finishes first: its blocks are freed first
    b = Request("b", 0.0, 64, 3, content=((2, 80),))
    engine.add_request(a, 0.0)
    engine.add_request(b, 0.0)
    run(engine)
    engine.add_request(Request("c", 9.0, 64, 1, content=((3, 64),)), 9.0)  # needs 4 of the 8 blocks
    run(engine, now=9.0)
    assert engine.cached_prefix_tokens(a.content, 64) == 0
    assert engine.cached_prefix_tokens(b.content, 64) == 48


def test_tail_blocks_are_evicted_before_head_blocks() -> None:
    engine = create_engine(num_gpu_blocks=8)
    engine.add_request(Request("a", 0.0, 64, 1, content=((1, 64),)), 0.0)  # blocks 0-3
    run(engine)
    engine.add_request(Request("b", 1.0, 64, 1, content=((2, 64),)), 1.0)  # takes never-used blocks 4-7
    run(engine, now=1.0)
    assert engine.cached_prefix_tokens(((1, 64),), 65) == 64
    engine.add_request(Request("c", 2.0, 32, 1, content=((3, 32),)), 2.0)  # evicts 2 blocks: a's tail
    run(engine, now=2.0)
    assert engine.cached_prefix_tokens(((1, 64),), 65) == 32


@pytest.mark.parametrize("caching", [True, False])
def test_preempted_request_frees_blocks_and_still_completes(caching: bool) -> None:
    engine = create_engine(num_gpu_blocks=8, enable_prefix_caching=caching)
    for req in create_requests(2, prompt_tokens=16, max_output_tokens=64):
        engine.add_request(req, 0.0)
    done, results = run(engine)
    preempt_steps = [r for r in results if r.preempted]
    assert preempt_steps and preempt_steps[0].preempted == ["r1"]  # the most recently admitted
    assert {f.request_id: f.output_tokens for f in done.values()} == {"r0": 64, "r1": 64}
    assert done["r1"].num_preemptions >= 1 and done["r0"].num_preemptions == 0
    assert engine.stats.num_preemptions == done["r1"].num_preemptions
    assert done["r1"].preempted_recompute_tokens > 0
    if caching:
        # Its blocks stayed cached except the tail block r0 took to grow: one block is recomputed.
        assert done["r1"].preempted_recompute_tokens == 16
    else:
        assert done["r1"].preempted_recompute_tokens >= 64  # everything it had computed
    assert engine.free_blocks == engine.total_blocks and not engine.has_unfinished()


def test_preemption_drops_the_victims_blocks_at_once() -> None:
    engine = create_engine(num_gpu_blocks=8)
    for req in create_requests(2, prompt_tokens=16, max_output_tokens=64):
        engine.add_request(req, 0.0)
    now = 0.0
    while True:
        result = engine.step(now)
        assert result is not None
        now = result.end_s
        if result.preempted:
            break
    assert (engine.num_running, engine.num_waiting) == (1, 1)
    assert engine.num_waiting_tokens > 16  # the victim must recompute its prompt and answer so far


def test_preloaded_request_preempted_recomputes_its_context_locally() -> None:
    engine = create_engine(num_gpu_blocks=10, enable_prefix_caching=False)
    engine.add_request(Request("r0", 0.0, 16, 64), 0.0)
    engine.add_request(Request("r1", 0.0, 64, 64), 0.0, preloaded_tokens=64, emitted_tokens=1)
    done, _ = run(engine)
    r1 = done["r1"]
    assert r1.num_preemptions >= 1
    assert (r1.transferred_tokens, r1.recomputed_tokens, r1.cache_hit_tokens) == (64, 0, 0)
    assert r1.preempted_recompute_tokens >= 64
    assert r1.output_tokens == 63


def test_retain_pins_blocks_until_release() -> None:
    engine = create_engine(num_gpu_blocks=8)
    engine.add_request(Request("a", 0.0, 64, 4, content=((1, 68),)), 0.0)
    engine.retain("a")
    run(engine)
    assert engine.retained_blocks() == 5  # 67 tokens of KV
    assert engine.free_blocks == 3 and engine.kv_usage == pytest.approx(5 / 8)
    engine.add_request(Request("b", 1.0, 40, 1, content=((2, 40),)), 1.0)  # needs all 3 free blocks
    run(engine, now=1.0)
    assert engine.cached_prefix_tokens(((1, 68),), 68) == 64  # pinned: not evicted
    engine.release("a")
    assert engine.retained_blocks() == 0 and engine.free_blocks == 8
    engine.add_request(Request("c", 2.0, 100, 1, content=((3, 100),)), 2.0)  # needs 7 blocks
    run(engine, now=2.0)
    assert engine.cached_prefix_tokens(((1, 68),), 68) < 64  # released blocks were evictable


def test_retain_right_after_the_finishing_step() -> None:
    engine = create_engine(num_gpu_blocks=8)
    engine.add_request(Request("a", 0.0, 30, 1, content=((1, 30),)), 0.0)
    result = engine.step(0.0)
    assert result is not None and [f.request_id for f in result.finished] == ["a"]
    engine.retain("a")
    engine.retain("a")  # idempotent
    assert engine.retained_blocks() == 2 and engine.free_blocks == 6
    with pytest.raises(ValueError, match="already"):
        engine.add_request(Request("a", 1.0, 30, 1), 1.0)
    engine.release("a")
    assert engine.free_blocks == 8


def test_retain_and_release_unknown_ids_raise() -> None:
    engine = create_engine()
    with pytest.raises(ValueError, match="cannot retain"):
        engine.retain("nope")
    with pytest.raises(ValueError, match="cannot release"):
        engine.release("nope")
    engine.add_request(Request("a", 0.0, 30, 1), 0.0)
    result = engine.step(0.0)
    assert result is not None
    assert engine.step(result.end_s) is None
    with pytest.raises(ValueError, match="cannot retain"):
        engine.retain("a")  # a later step ran: its blocks may have been reused


def test_retained_kv_blocks_admission_until_released() -> None:
    engine = create_engine(num_gpu_blocks=4)
    engine.add_request(Request("a", 0.0, 60, 1, content=((1, 60),)), 0.0)
    engine.retain("a")
    run(engine)
    engine.add_request(Request("b", 1.0, 40, 1), 1.0)
    assert engine.step(1.0) is None  # all blocks pinned: nothing can run
    engine.release("a")
    done, _ = run(engine, now=1.0)
    assert done["b"].output_tokens == 1


@pytest.mark.parametrize("after_steps", [0, 2])
def test_abort_frees_everything(after_steps: int) -> None:
    engine = create_engine()
    for req in create_requests(2, prompt_tokens=40, max_output_tokens=10):
        engine.add_request(req, 0.0)
    now = 0.0
    for _ in range(after_steps):
        result = engine.step(now)
        assert result is not None
        now = result.end_s
    aborted = engine.abort("r0", now)
    assert aborted is not None and aborted.aborted and aborted.finish_s == now
    assert engine.abort("r0", now) is None
    done, _ = run(engine, now=now)
    assert set(done) == {"r1"} and done["r1"].output_tokens == 10
    assert engine.free_blocks == engine.total_blocks
    assert (engine.num_decoding, engine.decode_context_tokens, engine.num_waiting_tokens) == (0, 0, 0)
