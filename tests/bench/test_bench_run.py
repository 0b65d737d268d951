"""The bench against an in-process fake OpenAI server on a simulated clock."""

from __future__ import annotations

import pytest

from tokenomy.bench import BenchReport, run_bench
from tokenomy.core import SLO
from tokenomy.policy.closedloop import RetryPolicy

from .factories import agent_sessions, config
from .fakes import BLOCK, FakeClock, FakeEngine, FakeOpener, tokens


def _run(sessions, engine: FakeEngine, **overrides) -> tuple[BenchReport, FakeClock]:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    return run_bench(sessions, config(**overrides), clock=clock, opener=FakeOpener(engine, clock)), clock


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_latencies_and_token_counts_come_from_the_stream_and_usage(api: str) -> None:
    engine = FakeEngine(ttft_s=0.2, itl_s=0.01)
    rep, _ = _run(agent_sessions(1, turns=3, out=8), engine, api=api)
    s = rep.summary
    assert s.requests == s.finished == 3
    assert s.ttft_p50_s == pytest.approx(0.2)
    assert s.tpot_p50_s == pytest.approx(0.01)  # vLLM's TPOT: the first token is excluded
    assert s.itl_p50_s == pytest.approx(0.01)
    assert s.e2e_p50_s == pytest.approx(0.2 + 7 * 0.01)
    assert [r.output_tokens for r in rep.records] == [8, 8, 8]
    path = "messages" if api == "chat" else "prompt"
    assert all(path in b and b["max_tokens"] == 8 and b["ignore_eos"] for b in engine.bodies)
    assert all(b["stream_options"] == {"include_usage": True} for b in engine.bodies)


def test_history_is_resent_and_cached_fraction_is_the_targets() -> None:
    engine = FakeEngine()
    sessions = agent_sessions(1, turns=3, sys_tokens=40, new=20, out=8)
    rep, _ = _run(sessions, engine, api="completions")
    prompts = [b["prompt"] for b in engine.bodies]
    # Each turn's prompt starts with the previous prompt and the answer the fake generated.
    for k in (1, 2):
        prev_tokens = tokens(prompts[k - 1])
        assert tokens(prompts[k])[: len(prev_tokens) + 8] == engine.cached[k - 1]
    rec = rep.records
    assert [r.prompt_tokens for r in rec] == [t.prompt_tokens for t in sessions[0].turns]
    expected_hits = [0] + [len(engine.cached[k - 1]) // BLOCK * BLOCK for k in (1, 2)]
    assert [r.usage.cache_hit_tokens for r in rec] == expected_hits
    assert rep.extras["cached_fraction"] == pytest.approx(sum(expected_hits) / sum(r.prompt_tokens for r in rec))
    assert rep.extras["prompt_tokens_mean_abs_rel_error"] == 0.0
    for r in rec:
        r.usage.check()  # cache-hit + recomputed == prompt, origin classes sum to the prompt too


def test_think_time_separates_a_turn_from_the_previous_answer() -> None:
    engine = FakeEngine(ttft_s=0.1, itl_s=0.01)
    rep, _ = _run(agent_sessions(1, turns=2, think_s=3.0, out=5), engine)
    first, second = rep.records
    assert first.finish_s is not None
    assert second.arrival_s - first.finish_s == pytest.approx(3.0)


def test_window_is_the_busy_time_and_span_is_first_send_to_last_finish() -> None:
    """One session, 2 turns of 0.1 + 4 x 0.01 s each, 3 s of think time between them: the span
    holds the think time, the busy window does not (a span of 0 was printed before)."""
    engine = FakeEngine(ttft_s=0.1, itl_s=0.01)
    rep, _ = _run(agent_sessions(1, turns=2, think_s=3.0, out=5), engine)
    assert rep.summary.span_s == pytest.approx(2 * 0.14 + 3.0)
    assert rep.summary.duration_s == pytest.approx(2 * 0.14)
    assert rep.summary.rpm == pytest.approx(2 / 0.28 * 60)


def test_rate_mode_starts_sessions_at_their_start_times() -> None:
    engine = FakeEngine(ttft_s=0.0, itl_s=0.0)
    rep, _ = _run(agent_sessions(3, turns=1, gap_s=5.0), engine)
    assert sorted(r.arrival_s for r in rep.records) == pytest.approx([0.0, 5.0, 10.0])


def test_errors_are_counted_by_status_and_end_their_session() -> None:
    engine = FakeEngine(fail={1: 429})
    rep, _ = _run(agent_sessions(1, turns=3), engine, retry=RetryPolicy(max_retries=0))
    assert rep.errors_by_status == {"429": 1}
    assert rep.extras["error_examples"] == {"429": "fake 429"}
    assert rep.summary.requests == 2 and rep.summary.finished == 1
    assert rep.summary.slo_attainment == pytest.approx(0.5)  # the failed request is a miss
    assert len(engine.bodies) == 2  # turn 2 was never sent: its history would lack turn 1's answer


def test_concurrency_caps_sessions_in_flight_and_runs_them_all() -> None:
    engine = FakeEngine()
    rep, _ = _run(agent_sessions(6, turns=2), engine, concurrency=2)
    assert engine.max_in_flight == 2
    assert rep.summary.finished == 12 and rep.extras["sessions"] == 6


def test_concurrency_mode_stops_sending_after_the_duration() -> None:
    engine = FakeEngine(ttft_s=0.5, itl_s=0.0)
    rep, _ = _run(agent_sessions(50, turns=4, think_s=1.0), engine, concurrency=1, duration_s=10.0)
    assert 0 < len(engine.bodies) < 200
    assert max(r.arrival_s for r in rep.records) < 10.0


def test_slo_attainment_uses_the_configured_bounds() -> None:
    engine = FakeEngine(ttft_s=0.3, itl_s=0.01)
    tight, _ = _run(agent_sessions(1, turns=2), engine, slo=SLO(ttft_s=0.2, tpot_s=1.0))
    loose, _ = _run(agent_sessions(1, turns=2), FakeEngine(ttft_s=0.3, itl_s=0.01), slo=SLO(ttft_s=0.5, tpot_s=1.0))
    assert tight.summary.slo_attainment == 0.0 and loose.summary.slo_attainment == 1.0


def test_sessions_are_spread_over_targets_and_stay_on_theirs() -> None:
    engine = FakeEngine()
    rep, _ = _run(agent_sessions(4, turns=2), engine, targets=("http://fake/v1", "http://fake:81"))
    by_session = {}
    for r in rep.records:
        by_session.setdefault(r.session_id, set()).add(r.decode_instance)
    assert all(len(v) == 1 for v in by_session.values())
    assert {next(iter(v)) for v in by_session.values()} == {
        "http://fake/v1/chat/completions", "http://fake:81/v1/chat/completions"}


def test_each_session_sends_its_tenants_key_and_results_are_per_tier() -> None:
    import dataclasses

    engine = FakeEngine(fail={2: 503})
    clock = FakeClock()
    sessions = [dataclasses.replace(s, tenant=t, tier=t) for s, t in zip(agent_sessions(2, turns=2), ("gold", "free"),
                                                                         strict=True)]
    opener = FakeOpener(engine, clock)
    cfg = config(tenant_keys=(("free", "tk-free"), ("gold", "tk-gold")), retry=RetryPolicy(max_retries=0))
    rep = run_bench(sessions, cfg, clock=clock, opener=opener)
    assert opener.auth == {"s0": {"Bearer tk-gold"}, "s1": {"Bearer tk-free"}}
    tiers = rep.summary.by_tier
    assert set(tiers) == {"gold", "free"}
    assert sum(g["refused"] for g in tiers.values()) == 1 == rep.errors_by_status["503"]
    assert sum(g["requests"] for g in tiers.values()) == rep.summary.requests  # refusals are records here


def test_a_tenant_without_a_key_is_refused_before_anything_is_sent() -> None:
    import dataclasses

    sessions = [dataclasses.replace(s, tenant="acme") for s in agent_sessions(1)]
    with pytest.raises(ValueError, match="no key for tenant\\(s\\) acme"):
        run_bench(sessions, config(tenant_keys=(("bob", "tk-bob"),)), clock=FakeClock(), opener=FakeOpener(FakeEngine(), FakeClock()))
