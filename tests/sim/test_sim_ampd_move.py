"""A local turn that would wait for memory on its decode instance moves, with its history, to a
decode instance with room (``AMPDOptions.move_held_turns``, on in ``ampd``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tokenomy.core import SLO, Request
from tokenomy.engine import Engine, EngineConfig
from tokenomy.perf import PerfModel
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import make_variant
from tokenomy.workload.registry import load_workload

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)
# GAIA sessions on four decode instances with little KV memory each (no prefill instance): turns
# often find their instance full while another has room.
CFG = SimConfig(deployment="ampd", instances=4, prefill=0, decode=4, gpu_memory_utilization=0.3)


def test_a_turn_that_would_wait_for_memory_moves_with_its_history_to_an_instance_with_room() -> None:
    sessions = load_workload("gaia", rate_per_s=1.0, duration_s=20.0, seed=1)
    events: list[dict[str, Any]] = []
    res = simulate(sessions, make_variant("ampd", CFG), SLO(2.0, 0.1), perf=PERF,
                   decision_trace=events.append)
    moves = [e for e in events if e["kind"] == "binding" and e["reason"].startswith("turn would wait")]
    assert moves and all(e["rebound"] and e["move_history"] and e["from_instance"] != e["instance_id"]
                         for e in moves)
    by_session: dict[str, list[Any]] = {}
    for r in res.records:
        assert r.finished
        r.usage.check()
        by_session.setdefault(r.session_id, []).append(r)
    for m in moves:
        turn = next(r for r in by_session[m["session_id"]]
                    if r.arrival_s <= m["t_s"] and r.finish_s is not None and r.finish_s >= m["t_s"])
        assert turn.decode_instance == m["instance_id"]  # it ran where it moved
        # its history came along over the KV link: only the new tokens were computed
        assert turn.usage.recomputed_tokens == turn.usage.incremental_prefill_tokens
        assert turn.usage.cache_hit_tokens == turn.usage.history_tokens > 0
    # without the mechanism no turn moves this way
    events.clear()
    cfg = make_variant("ampd", CFG)
    off = replace(cfg, ampd=replace(cfg.ampd, move_held_turns=False))
    simulate(sessions, off, SLO(2.0, 0.1), perf=PERF, decision_trace=events.append)
    assert not any(e["kind"] == "binding" and e["reason"].startswith("turn would wait") for e in events)


def test_history_cached_in_free_blocks_counts_as_taken_by_the_turn_that_reuses_it() -> None:
    # The move's memory test: a finished turn's blocks become free-cached; its
    # session's next turn reuses them, which takes them off the free pool, as the engine's admission
    # counts them. So the free blocks left for that turn exclude them; pinned, they are not free.
    engine = Engine("d0", EngineConfig(num_gpu_blocks=64, block_size_tokens=16), PERF)
    content = ((7, 1_000),)
    engine.add_request(Request("t0", 0.0, 500, 4, content=content), 0.0)
    now = 0.0
    while (step := engine.step(now)) is not None:
        now = step.end_s
        engine.end_step()
    cached = engine.cached_prefix_tokens(content, 900)
    assert cached == 496 and engine.free_blocks == 64  # 31 full blocks, all in the free pool
    assert engine.cached_prefix_free_blocks(content, 900) == 31
    engine.add_request(Request("t1", now, 900, 4, content=content), now)
    engine.retain("t1")
    while (step := engine.step(now)) is not None:
        now = step.end_s
        engine.end_step()
    assert engine.cached_prefix_free_blocks(content, 1_000) == 0  # pinned by retention now
    assert engine.cached_prefix_tokens(content, 1_000) == 896
