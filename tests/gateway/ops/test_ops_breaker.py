"""Agent circuit breakers: a runaway agent is stopped at its cap, with a clear code and a cooldown."""

from __future__ import annotations

import asyncio

import pytest

from helpers.ops_factory import FakeClock, add_key, make_guard, request
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.guard import SettledUsage


def run(coro):
    return asyncio.run(coro)


def turn(guard, raw, i, session="s1", fingerprint=None, prompt=100, max_tokens=100):
    adm = run(guard.admit(request(raw, f"r{i}", session=session, fingerprint=fingerprint, prompt=prompt,
                                  max_tokens=max_tokens)))
    run(guard.settle(adm, SettledUsage(prompt, 10, 0, (prompt + 20) / 1e6)))
    return adm


def test_runaway_agent_repeating_one_tool_call_is_refused_at_the_cap(tmp_path):
    """A scripted agent calling the same tool in a loop: refused at the 4th identical call, at once
    (no time passes on the simulated clock), with a cooldown; other sessions are unaffected."""
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, breaker={"repeat_limit": 4, "cooldown_s": 30})
    raw, _ = add_key(guard)
    turn(guard, raw, 0, fingerprint="plan")
    served = 0
    with pytest.raises(GatewayError) as err:
        for i in range(1, 100):
            turn(guard, raw, i, fingerprint="search(q='x')")
            served += 1
    assert served == 3
    e = err.value
    assert (e.status, e.code, e.headers["retry-after"]) == (429, "breaker_repetition", "30")
    assert "repeated 4 times" in e.message
    with pytest.raises(GatewayError) as again:  # open: even a different call waits out the cooldown
        turn(guard, raw, 200, fingerprint="other")
    assert again.value.code == "breaker_repetition"
    turn(guard, raw, 300, session="s2", fingerprint="search(q='x')")
    clock.advance(30.0)
    turn(guard, raw, 201, fingerprint="other")
    trips = [a for a in guard.alerter.recent if a.kind == "breaker_trip"]
    assert len(trips) == 1 and trips[0].data["code"] == "breaker_repetition"


def test_turn_cap(tmp_path):
    guard = make_guard(tmp_path, breaker={"max_turns_per_session": 3})
    raw, _ = add_key(guard)
    for i in range(3):
        turn(guard, raw, i, fingerprint=str(i))
    with pytest.raises(GatewayError) as err:
        turn(guard, raw, 3, fingerprint="3")
    assert err.value.code == "breaker_turn_cap"


def test_a_stream_is_cut_the_moment_it_crosses_the_velocity_cap(tmp_path):
    clock = FakeClock()
    guard = make_guard(tmp_path, clock, breaker={"session_tokens_per_min": 1000})
    raw, _ = add_key(guard)
    adm = run(guard.admit(request(raw, "r1", session="s", prompt=100, max_tokens=2000)))
    delivered = 0
    while guard.on_tokens(adm, 10):  # per chunk; a chunk answered False is not forwarded
        delivered += 10
        assert delivered < 2000, "never cut"
    assert delivered + 100 <= 1000 < delivered + 100 + 10  # cut at the chunk that would cross the cap
    run(guard.settle(adm, SettledUsage(100, delivered, 0, 0.001)))
    with pytest.raises(GatewayError) as err:
        run(guard.admit(request(raw, "r2", session="s")))
    assert err.value.code == "breaker_velocity"


def test_session_budget_caps_the_output_and_cuts_the_stream(tmp_path):
    # $1/M input, $2/M output: prompt 100 = $0.0001; session budget $0.0011 leaves $0.001 = 500 tokens
    guard = make_guard(tmp_path, breaker={"session_budget_usd": 0.0011})
    raw, _ = add_key(guard)
    adm = run(guard.admit(request(raw, "r1", session="s", prompt=100, max_tokens=4000)))
    assert adm.output_token_cap == 500
    n = 0
    while guard.on_tokens(adm, 1):  # the request path forwards a chunk only when this says True
        n += 1
    assert n == 500  # exactly the session's budget delivered; the 501st token cut
    run(guard.settle(adm, SettledUsage(100, 500, 0, 0.0011)))
    with pytest.raises(GatewayError) as err:
        run(guard.admit(request(raw, "r2", session="s")))
    assert err.value.code == "breaker_session_budget"


def test_key_velocity_breaker_covers_requests_without_a_session(tmp_path):
    guard = make_guard(tmp_path, breaker={"key_tokens_per_min": 500})
    raw, _ = add_key(guard)
    run(guard.admit(request(raw, "r1", prompt=300, max_tokens=10)))
    run(guard.admit(request(raw, "r2", prompt=300, max_tokens=10)))  # crosses: let through, breaker opens
    with pytest.raises(GatewayError) as err:
        run(guard.admit(request(raw, "r3", prompt=1, max_tokens=1)))
    assert err.value.code == "breaker_velocity" and int(err.value.headers["retry-after"]) > 0


def test_a_session_that_cannot_pay_for_its_prompt_and_one_token_is_refused(tmp_path):
    guard = make_guard(tmp_path, breaker={"session_budget_usd": 0.0001})  # the prompt alone costs $0.0001
    raw, _ = add_key(guard)
    with pytest.raises(GatewayError) as err:
        run(guard.admit(request(raw, "r1", session="s", prompt=100)))
    assert err.value.code == "breaker_session_budget"
