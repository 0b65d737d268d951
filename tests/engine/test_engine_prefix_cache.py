"""Prefix caching: hits cut prefill work exactly, never cover the whole prompt, span turns."""

from __future__ import annotations

import pytest
from engine_factory import computed_prefill_tokens, create_engine, run

from tokenomy.core import Request


def _prime(engine, content, prompt_tokens: int, rid: str = "a") -> None:
    engine.add_request(Request(rid, 0.0, prompt_tokens, 1, content=content), 0.0)
    done, _ = run(engine)
    assert done[rid].recomputed_tokens == prompt_tokens


@pytest.mark.parametrize(
    ("shared", "prompt_b", "expected_hit"),
    [
        (70, 100, 64),  # shared part floored to full blocks
        (100, 100, 96),  # whole prompt cached: the last partial block is computed anyway
        (96, 96, 80),  # block-aligned full hit: one block is recomputed (at least one token computes)
        (15, 100, 0),  # less than a block shared
        (0, 100, 0),
    ],
)
def test_second_request_computes_only_the_unshared_part(
    shared: int, prompt_b: int, expected_hit: int
) -> None:
    engine = create_engine()
    _prime(engine, ((1, 100),), 100)
    content_b = ((1, shared), (2, prompt_b - shared)) if shared < prompt_b else ((1, prompt_b),)
    assert engine.cached_prefix_tokens(content_b, prompt_b) == expected_hit
    engine.add_request(Request("b", 1.0, prompt_b, 1, content=content_b), 1.0)
    done, results = run(engine, now=1.0)
    assert done["b"].cache_hit_tokens == expected_hit
    assert done["b"].recomputed_tokens == prompt_b - expected_hit
    assert computed_prefill_tokens(results) == prompt_b - expected_hit
    assert engine.stats.prefix_cache_hits_tokens == expected_hit
    assert engine.stats.prefix_cache_queries_tokens == 100 + prompt_b


def test_requests_without_content_never_share() -> None:
    engine = create_engine()
    _prime(engine, (), 100)
    engine.add_request(Request("b", 1.0, 100, 1), 1.0)
    done, _ = run(engine, now=1.0)
    assert done["b"].cache_hit_tokens == 0
    assert engine.cached_prefix_tokens((), 100) == 0


def test_prefix_caching_disabled_computes_everything() -> None:
    engine = create_engine(enable_prefix_caching=False)
    _prime(engine, ((1, 100),), 100)
    assert engine.cached_prefix_tokens(((1, 100),), 100) == 0
    engine.add_request(Request("b", 1.0, 100, 1, content=((1, 100),)), 1.0)
    done, _ = run(engine, now=1.0)
    assert done["b"].recomputed_tokens == 100
    assert engine.stats.prefix_cache_queries_tokens == 0


def test_same_tokens_split_into_different_segments_share_blocks() -> None:
    engine = create_engine()
    _prime(engine, ((1, 100),), 100)
    # Same stream, written as three contiguous segments: identical tokens, identical keys.
    assert engine.cached_prefix_tokens(((1, 40), (1, 30), (1, 30)), 100) == 96


def test_session_turn_two_hits_turn_one_prompt_and_output() -> None:
    engine = create_engine()
    turn1 = Request("s:0", 0.0, 100, 20, session_id="s", content=((7, 120),))
    engine.add_request(turn1, 0.0)
    done, _ = run(engine)
    assert done["s:0"].output_tokens == 20
    # KV exists for 119 tokens (the last sampled token is never computed): 7 full blocks = 112 tokens,
    # past the 100 prompt tokens, so the answer is reused too.
    turn2 = Request(
        "s:1", 5.0, 150, 10, session_id="s", turn=1, history_tokens=120, content=((7, 120), (8, 30))
    )
    assert engine.cached_prefix_tokens(turn2.content, 150) == 112
    engine.add_request(turn2, 5.0)
    done, results = run(engine, now=5.0)
    assert done["s:1"].cache_hit_tokens == 112
    assert computed_prefill_tokens(results) == 150 - 112


def test_cached_prefix_lookup_leaves_lru_order_alone() -> None:
    engine = create_engine(num_gpu_blocks=32)
    _prime(engine, ((1, 100),), 100)
    pool = engine._kv.pool
    before = pool.free_order()
    assert engine.cached_prefix_tokens(((1, 100),), 100) == 96
    assert pool.free_order() == before
    assert engine.free_blocks == 32


def test_concurrent_identical_prompts_both_compute_and_stay_consistent() -> None:
    engine = create_engine()
    for rid in ("a", "b"):
        engine.add_request(Request(rid, 0.0, 100, 3, content=((1, 100),)), 0.0)
    done, _ = run(engine)
    assert {f.recomputed_tokens for f in done.values()} == {100}
    assert engine.cached_prefix_tokens(((1, 100),), 100) == 96
    assert engine.free_blocks == engine.total_blocks
