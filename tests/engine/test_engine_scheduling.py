"""Token budget, chunking, timing, PD roles, and exact accounting under random load."""

from __future__ import annotations

import random

import pytest
from engine_factory import FakePerf, computed_prefill_tokens, create_engine, create_requests, run

from tokenomy.core import Request
from tokenomy.engine import Engine


def _check_counters(engine: Engine) -> None:
    """The O(1) view counters equal a brute-force recount."""
    queues = engine._queues
    queues.check(engine._requests.values())
    decoding = [r for r in queues.running if r.decoding]
    assert engine.num_decoding == len(decoding)
    assert engine.decode_context_tokens == sum(r.num_tokens for r in decoding)
    pending = sum(r.pending_tokens for r in list(queues.running) + list(queues.waiting))
    assert engine.num_waiting_tokens == pending + engine._step_prefill_tokens  # + the step in flight
    for r in decoding:
        assert r.num_tokens - r.num_computed == 1 and r.num_computed >= r.prompt_tokens
    held = sum(1 for c in engine._kv.pool.ref_cnt if c > 0)
    assert engine.free_blocks == engine.total_blocks - held
    pool = engine._kv.pool
    free = pool.free_order()
    assert len(free) == len(set(free)) == engine.free_blocks
    assert all(pool.ref_cnt[b] == 0 for b in free)
    assert all(pool.key_of(b) == k for k, b in pool.cached.items())
    assert sum(pool.key_of(b) is not None for b in range(pool.num_blocks)) == len(pool.cached)


@pytest.mark.parametrize("seed", range(12))
def test_random_load_respects_limits_and_accounts_every_token(seed: int) -> None:
    _random_load(seed)


def _random_load(seed: int) -> tuple[int, int]:
    """Random arrivals, configs and request kinds; asserts limits each step and accounting at the end."""
    rng = random.Random(seed)
    chunked = rng.random() < 0.7
    budget = rng.choice([32, 64, 200, 512])
    threshold = rng.choice([0, 0, 24, 100]) if chunked else 0
    max_seqs = rng.choice([2, 4, 64])
    perf = FakePerf(base_s=0.01, per_prefill_token_s=1e-4)
    engine = create_engine(
        perf,
        num_gpu_blocks=rng.choice([12, 40, 400]),
        block_size_tokens=rng.choice([4, 16]),
        max_num_batched_tokens=budget,
        max_num_seqs=max_seqs,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=rng.random() < 0.8,
    )
    expected: dict[str, tuple[int, int]] = {}  # id -> (prompt, outputs this instance emits)
    arrivals = []
    for i in range(40):
        prompt = rng.randint(1, 120)
        output = rng.randint(1, 30)
        if not chunked:
            prompt = min(prompt, budget // 2)
            output = min(output, budget // 2)
        shared = rng.choice([0, prompt // 2, prompt])
        content = (
            ((1, shared), (100 + i, prompt + output - shared)) if shared else ((100 + i, prompt + output),)
        )
        req = Request(f"q{i}", 0.0, prompt, output, content=content)
        kind = rng.choice(["plain", "plain", "prefill_only", "preloaded"])
        kwargs: dict[str, object] = {}
        emits = output
        if kind == "prefill_only":
            kwargs["prefill_only"] = True
            emits = 1
        elif kind == "preloaded" and output > 1:
            kwargs.update(preloaded_tokens=rng.randint(0, prompt), emitted_tokens=1)
            emits = output - 1
        arrivals.append((rng.uniform(0, 2.0), req, kwargs))
        expected[req.request_id] = (prompt, emits)
    arrivals.sort(key=lambda a: a[0])
    finished = {}
    now = 0.0
    for _ in range(20_000):
        while arrivals and arrivals[0][0] <= now:
            _, req, kwargs = arrivals.pop(0)
            try:
                engine.add_request(req, now, **kwargs)  # type: ignore[arg-type]
            except ValueError:
                del expected[req.request_id]  # could never fit this instance
        result = engine.step(now)
        _check_counters(engine)
        if result is None:
            if not arrivals:
                break
            now = arrivals[0][0]
            continue
        shape = result.shape
        assert shape.total_tokens <= budget
        assert shape.prefill_seqs + shape.decode_seqs <= max_seqs
        assert engine.num_running <= max_seqs
        assert len(set(result.emitted)) == len(result.emitted)
        assert set(result.first_token) <= set(result.emitted)
        if threshold:
            assert shape.prefill_tokens <= threshold * shape.prefill_seqs
        for f in result.finished:
            assert f.request_id not in finished
            finished[f.request_id] = f
        now = result.end_s
    assert set(finished) == set(expected)
    for rid, f in finished.items():
        prompt, emits = expected[rid]
        assert f.cache_hit_tokens + f.transferred_tokens + f.recomputed_tokens == prompt
        assert f.output_tokens == emits
        assert f.first_token_s is not None and f.first_token_s <= f.finish_s
    assert engine.free_blocks == engine.total_blocks and not engine.has_unfinished()
    return engine.stats.num_preemptions, engine.stats.prefix_cache_hits_tokens


def test_random_load_exercises_preemption_and_cache_hits() -> None:
    totals = [_random_load(seed) for seed in range(12)]
    assert sum(p for p, _ in totals) > 0 and sum(h for _, h in totals) > 0


def test_long_prefill_threshold_caps_each_chunk() -> None:
    perf = FakePerf()
    engine = create_engine(perf, long_prefill_token_threshold=50, max_num_batched_tokens=1000)
    engine.add_request(Request("a", 0.0, 200, 1), 0.0)
    run(engine)
    assert [s.prefill_tokens for s in perf.shapes] == [50, 50, 50, 50]


def test_a_request_chunk_cap_limits_only_that_request() -> None:
    perf = FakePerf()
    engine = create_engine(perf, max_num_batched_tokens=1000)
    engine.add_request(Request("a", 0.0, 100, 1), 0.0, max_chunk_tokens=40)
    engine.add_request(Request("b", 0.0, 100, 1), 0.0)
    run(engine)
    # a computes 40 + 40 + 20 over three steps; b, uncapped, its whole prompt in the first
    assert [s.prefill_tokens for s in perf.shapes] == [140, 40, 20]
    with pytest.raises(ValueError, match="max_chunk_tokens"):
        engine.add_request(Request("c", 0.0, 10, 1), 0.0, max_chunk_tokens=-1)


def test_chunked_prefill_splits_a_prompt_over_the_budget() -> None:
    perf = FakePerf()
    engine = create_engine(perf, max_num_batched_tokens=64)
    engine.add_request(Request("a", 0.0, 150, 2), 0.0)
    done, _ = run(engine)
    assert [(s.prefill_tokens, s.decode_seqs) for s in perf.shapes] == [(64, 0), (64, 0), (22, 0), (0, 1)]
    # Attention pairs of the second chunk see the first chunk as context.
    assert perf.shapes[1].prefill_attn_pairs == pytest.approx(64 * (64 + 65 / 2))
    assert done["a"].output_tokens == 2


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget() -> None:
    perf = FakePerf()
    engine = create_engine(perf, max_num_batched_tokens=100, enable_chunked_prefill=False)
    engine.add_request(Request("a", 0.0, 60, 3), 0.0)
    engine.add_request(Request("b", 0.0, 60, 3), 0.0)
    run(engine)
    # b does not fit next to a's 60 tokens and is not chunked: it runs alongside a's decodes.
    assert [(s.prefill_tokens, s.decode_seqs) for s in perf.shapes][:2] == [(60, 0), (60, 1)]


def test_first_token_and_itl_times_follow_step_durations() -> None:
    perf = FakePerf(base_s=0.01, per_prefill_token_s=0.001)
    engine = create_engine(perf)
    engine.add_request(Request("a", 0.0, 100, 5), 0.0)
    now = 0.0
    for _ in range(2):
        result = engine.step(now)
        assert result is not None
        now = result.end_s
    assert result is not None and result.start_s == pytest.approx(0.11)
    engine.add_request(Request("b", now, 300, 1), now)  # its prefill stretches a's next gap
    done, _ = run(engine, now=now)
    a = done["a"]
    assert a.first_token_s == pytest.approx(0.11)
    assert a.max_itl_s == pytest.approx(0.31)
    assert a.finish_s == pytest.approx(0.11 + 0.01 + 0.31 + 0.01 + 0.01)


def test_prefill_only_finishes_with_the_first_token() -> None:
    engine = create_engine()
    engine.add_request(Request("p", 0.0, 100, 50), 0.0, prefill_only=True)
    done, results = run(engine)
    assert len(results) == 1
    p = done["p"]
    assert (p.output_tokens, p.first_token_s, p.finish_s) == (1, results[0].end_s, results[0].end_s)
    assert results[0].first_token == ["p"]


def test_preloaded_request_skips_compute_and_continues_decoding() -> None:
    perf = FakePerf()
    engine = create_engine(perf)
    engine.add_request(Request("d", 0.0, 100, 10), 0.0, preloaded_tokens=100, emitted_tokens=1)
    done, results = run(engine)
    assert computed_prefill_tokens(results) == 0
    assert all(s.decode_seqs == 1 for s in perf.shapes)
    d = done["d"]
    assert (d.transferred_tokens, d.recomputed_tokens, d.output_tokens) == (100, 0, 9)
    assert d.first_token_s == results[0].end_s


def test_partial_preload_and_local_hits_split_the_prompt() -> None:
    engine = create_engine()
    engine.add_request(Request("a", 0.0, 40, 1, content=((1, 40),)), 0.0)
    run(engine)
    engine.add_request(Request("b", 1.0, 100, 1, content=((1, 100),)), 1.0, preloaded_tokens=64)
    done, results = run(engine, now=1.0)
    b = done["b"]
    assert (b.cache_hit_tokens, b.transferred_tokens, b.recomputed_tokens) == (32, 32, 36)
    assert computed_prefill_tokens(results) == 36


def test_view_counters_track_waiting_and_decoding() -> None:
    engine = create_engine()
    for req in create_requests(3, prompt_tokens=40, max_output_tokens=5):
        engine.add_request(req, 0.0)
    assert (engine.num_waiting, engine.num_running, engine.num_waiting_tokens) == (3, 0, 120)
    result = engine.step(0.0)
    assert result is not None
    assert (engine.num_waiting, engine.num_running, engine.num_decoding) == (0, 3, 3)
    assert engine.num_waiting_tokens == 120  # the step in flight computes them
    engine.end_step()
    assert engine.num_waiting_tokens == 0
    assert engine.decode_context_tokens == 3 * 41
    assert 0 < engine.kv_usage < 1 and engine.block_size_tokens == 16 and engine.total_blocks == 1000


def test_running_requests_are_scheduled_before_waiting_ones() -> None:
    perf = FakePerf()
    engine = create_engine(perf, max_num_batched_tokens=64)
    engine.add_request(Request("a", 0.0, 64, 3), 0.0)
    result = engine.step(0.0)
    assert result is not None
    engine.add_request(Request("b", 0.0, 200, 1), result.end_s)
    result = engine.step(result.end_s)
    assert result is not None and result.emitted == ["a"]
    assert (result.shape.decode_seqs, result.shape.prefill_tokens) == (1, 63)


def _trace(seed: int) -> list[tuple[float, list[str], list[str]]]:
    rng = random.Random(seed)
    engine = create_engine(num_gpu_blocks=30, max_num_batched_tokens=128, block_size_tokens=8)
    for i in range(30):
        shared = rng.choice([0, 40, 80])
        prompt = shared + rng.randint(1, 60)
        content = ((1, shared), (50 + i, prompt + 20)) if shared else ((50 + i, prompt + 20),)
        engine.add_request(Request(f"t{i}", 0.0, prompt, rng.randint(1, 20), content=content), 0.0)
    _, results = run(engine)
    return [(r.start_s, r.emitted, r.preempted) for r in results]


@pytest.mark.parametrize("seed", range(4))
def test_skipping_hopeless_admission_retries_changes_nothing(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _trace(seed)
    from tokenomy.engine.kv_manager import KVManager

    monkeypatch.setattr(KVManager, "still_blocked", lambda self, blocked, budget: False)
    assert _trace(seed) == fast
