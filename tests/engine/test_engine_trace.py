"""The engine's event trace and its per-engine key-chain cache."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from engine_factory import FakePerf, create_requests

from tokenomy.core import Request
from tokenomy.engine import Engine, EngineConfig, JsonlTrace, KeyChainCache, ListTrace, NoTrace
from tokenomy.engine.trace import TraceEvent
from tokenomy.perf import PerfModel

PERF = PerfModel.from_names("llama-3.1-8b", "h100", 1)


def _engine(trace: object, num_blocks: int = 1000, **kw: object) -> Engine:
    cfg = EngineConfig(num_gpu_blocks=num_blocks, block_size_tokens=4, **kw)  # type: ignore[arg-type]
    return Engine("e0", cfg, FakePerf(), trace=trace)  # type: ignore[arg-type]


def _drive(engine: Engine, now: float = 0.0) -> float:
    while (result := engine.step(now)) is not None:
        now = result.end_s
    return now


def _kinds(events: list[TraceEvent], request: str) -> list[str]:
    return [e["kind"] for e in events if e.get("request") == request]


def test_a_request_life_is_queued_admit_steps_finish_with_engine_time() -> None:
    trace = ListTrace()
    engine = _engine(trace)
    engine.add_request(Request("a", 0.0, 10, 3), 5.0)
    end = _drive(engine, 5.0)
    events = trace.events
    assert _kinds(events, "a") == ["queued", "admit", "finish"]
    assert [e["kind"] for e in events].count("step") == 3  # prefill + sample, then two decodes
    assert events[0] == {"t_s": 5.0, "kind": "queued", "instance": "e0", "request": "a", "prompt_tokens": 10,
                         "max_output_tokens": 3, "preloaded_tokens": 0, "continuation": False}
    step = events[2]
    assert step["t_s"] == 5.0 and step["prefill_tokens"] == 10 and step["emitted"] == 1 and step["running"] == 1
    assert events[-1]["kind"] == "finish" and events[-1]["t_s"] == end and events[-1]["output_tokens"] == 3
    times = [e["t_s"] for e in events]
    assert times == sorted(times)


def test_preemption_readmission_and_eviction_are_traced() -> None:
    trace = ListTrace()
    engine = _engine(trace, num_blocks=12)  # 48 tokens of KV: two 20-token prompts cannot both grow
    for req in create_requests(2, prompt_tokens=20, max_output_tokens=24):
        engine.add_request(req, 0.0)
    _drive(engine)
    preempts = [e for e in trace.events if e["kind"] == "preempt"]
    assert preempts and preempts[0]["request"] == "r1" and preempts[0]["num_preemptions"] == 1
    readmits = [e for e in trace.events if e["kind"] == "admit" and e["readmission"]]
    assert [e["request"] for e in readmits] == ["r1"]
    assert readmits[0]["cache_hit_tokens"] > 0  # its own blocks stayed cached until evicted
    evicted = [e["blocks"] for e in trace.events if e["kind"] == "evict"]
    assert evicted and sum(evicted) == engine._kv.pool.num_evicted


def test_abort_is_traced_at_the_given_time() -> None:
    trace = ListTrace()
    engine = _engine(trace)
    engine.add_request(Request("a", 0.0, 10, 30), 0.0)
    engine.step(0.0)
    engine.abort("a", 0.5)
    assert trace.events[-1]["kind"] == "abort" and trace.events[-1]["t_s"] == 0.5


def _decode_heavy(trace: object) -> Engine:
    cfg = EngineConfig(num_gpu_blocks=40, block_size_tokens=4)  # short enough that decode growth evicts
    engine = Engine("e0", cfg, PERF, trace=trace)  # type: ignore[arg-type]
    for i, req in enumerate(create_requests(4, prompt_tokens=20, content=((0, 200),))):
        req.max_output_tokens = 20 + 9 * i
        engine.add_request(req, 0.0)
    return engine


def test_decode_runs_trace_exactly_what_single_steps_trace() -> None:
    single_trace, run_trace = ListTrace(), ListTrace()
    _drive(_decode_heavy(single_trace))
    engine, now, runs = _decode_heavy(run_trace), 0.0, 0
    while True:
        run = engine.plan_decode_run(now)
        if run is not None:
            runs += 1
            engine.advance_decode_run(run.starts[run.num_steps // 2])
            now = engine.close_decode_run(run.end_s).end_s
            continue
        result = engine.step(now)
        if result is None:
            break
        now = result.end_s
    assert runs >= 2
    assert any(e["kind"] == "evict" for e in single_trace.events)
    assert run_trace.events == single_trace.events


def test_no_trace_and_notrace_give_the_same_results() -> None:
    plain, silent = _decode_heavy(None), _decode_heavy(NoTrace())
    assert silent._tracer is None
    assert [r.end_s for r in _steps(plain)] == [r.end_s for r in _steps(silent)]


def _steps(engine: Engine) -> list[object]:
    out, now = [], 0.0
    while (result := engine.step(now)) is not None:
        out.append(result)
        now = result.end_s
    return out


def test_jsonl_trace_writes_one_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with JsonlTrace(path) as trace:
        engine = _engine(trace)
        engine.add_request(Request("a", 0.0, 10, 2), 0.0)
        _drive(engine)
    lines = path.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == trace.num_events and [e["kind"] for e in events][:2] == ["queued", "admit"]
    stream = io.StringIO()
    JsonlTrace(stream).emit({"t_s": 1.5, "kind": "step"})
    assert stream.getvalue() == '{"t_s":1.5,"kind":"step"}\n'


def test_each_engine_has_its_own_key_chains_unless_given_one() -> None:
    content = ((7, 64),)
    a, b = _engine(None), _engine(None)
    a.add_request(Request("x", 0.0, 40, 4, content=content), 0.0)
    assert len(a._kv.chains) == 1 and len(b._kv.chains) == 0
    shared = KeyChainCache()
    c = Engine("c", EngineConfig(num_gpu_blocks=100, block_size_tokens=4), FakePerf(), key_chains=shared)
    d = Engine("d", EngineConfig(num_gpu_blocks=100, block_size_tokens=4), FakePerf(), key_chains=shared)
    c.add_request(Request("x", 0.0, 40, 4, content=content), 0.0)
    d.add_request(Request("x", 0.0, 40, 4, content=content), 0.0)
    assert len(shared) == 1 and c._requests["x"].chain is d._requests["x"].chain


def test_key_chain_cache_is_bounded_lru() -> None:
    cache = KeyChainCache(max_entries=2)
    first = cache.get(((1, 32),), 4)
    cache.get(((2, 32),), 4)
    assert cache.get(((1, 32),), 4) is first  # refreshed: now the most recent
    cache.get(((3, 32),), 4)  # drops (2, 32)
    assert len(cache) == 2 and cache.get(((1, 32),), 4) is first


def test_preemption_and_a_stuck_queue_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tokenomy.engine")
    engine = _engine(None, num_blocks=12)
    for req in create_requests(2, prompt_tokens=20, max_output_tokens=24):
        engine.add_request(req, 0.0)
    now = _drive(engine)
    assert any("preempted 1 requests" in r.getMessage() for r in caplog.records)
    engine.add_request(Request("a", 0.0, 8, 2), now)
    engine.retain("a")
    now = _drive(engine, now)
    engine.add_request(Request("b", 0.0, 40, 4), now)  # needs 11 of the 12 blocks; "a" pins 3
    assert engine.step(now) is None
    assert "nothing fits" in caplog.records[-1].getMessage() and caplog.records[-1].levelno == logging.DEBUG
