"""The bench retries a refused turn as agent SDKs do: after the retry-after it got, a bounded
number of times; the turn is one request whose TTFT counts from its first attempt."""

from __future__ import annotations

import dataclasses

import pytest

from tokenomy.bench import BenchReport, run_bench
from tokenomy.core import SLO
from tokenomy.policy.closedloop import RetryPolicy

from .factories import agent_sessions, config
from .fakes import FakeClock, FakeEngine, FakeOpener


def _run(engine: FakeEngine, turns: int = 3, **overrides) -> tuple[BenchReport, FakeClock, FakeOpener]:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    opener = FakeOpener(engine, clock)
    sessions = [dataclasses.replace(s, tenant="gold", tier="gold") for s in agent_sessions(1, turns=turns, think_s=2.0)]
    return run_bench(sessions, config(**overrides), clock=clock, opener=opener), clock, opener


def test_a_shed_turn_is_sent_again_after_its_retry_after_and_its_ttft_counts_from_the_first_attempt() -> None:
    engine = FakeEngine(ttft_s=0.1, itl_s=0.0, fail={1: 503}, fail_headers={1: {"retry-after": "3"}})
    rep, clock, opener = _run(engine, slo=SLO(ttft_s=2.0, tpot_s=1.0))
    assert len(engine.bodies) == 4 and engine.bodies[1] == engine.bodies[2]  # the same request, sent again
    assert [h["x-stainless-retry-count"] for h in opener.sent] == ["0", "0", "1", "0"]  # as the SDKs count
    assert 3.0 in clock.sleeps
    s = rep.summary
    assert s.requests == s.finished == 3  # one request per turn, the session went on
    second = rep.records[1]
    assert second.ttft_s == pytest.approx(3.0 + 0.1)  # what the user waited: refusal, retry-after, answer
    assert s.slo_met == 2  # ... so that turn missed its 2 s TTFT
    assert s.by_tier["gold"]["retried"] == 1 and s.by_tier["gold"]["refused"] == 0
    assert rep.errors_by_status == {"503": 1}  # every refused answer is still counted
    assert rep.extras["retries"] == 1 and rep.extras["abandoned_turns"] == 0


def test_a_turn_refused_past_its_retries_is_abandoned_and_ends_its_session() -> None:
    engine = FakeEngine(fail={1: 503, 2: 429, 3: 503})  # no retry-after: the SDK's backoff
    rep, clock, _ = _run(engine, retry=RetryPolicy(max_retries=2))
    assert len(engine.bodies) == 4  # turn 0, then turn 1 three times; turn 2 never sent
    assert [s for s in clock.sleeps if 0.1 < s < 2.0] == [0.5, 1.0]  # (the fake's token delays are <= 0.05 s)
    s = rep.summary
    assert s.requests == 2 and s.finished == 1  # the abandoned turn is one unfinished request
    assert s.by_tier["gold"]["refused"] == 1 and s.by_tier["gold"]["retried"] == 2
    assert rep.errors_by_status == {"429": 1, "503": 2}
    assert rep.extras["abandoned_turns"] == 1


def test_a_refusal_the_server_says_not_to_retry_ends_the_session_at_once() -> None:
    engine = FakeEngine(fail={0: 429}, fail_headers={0: {"retry-after": "1", "x-should-retry": "false"}})
    rep, _, _ = _run(engine)
    assert len(engine.bodies) == 1
    assert rep.summary.by_tier["gold"]["refused"] == 1 and rep.summary.by_tier["gold"]["retried"] == 0


def test_other_failures_are_not_retried() -> None:
    engine = FakeEngine(fail={0: 500})
    rep, _, _ = _run(engine)
    assert len(engine.bodies) == 1 and rep.errors_by_status == {"500": 1}
