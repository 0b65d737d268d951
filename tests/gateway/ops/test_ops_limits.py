"""Rate limits: RPM/TPM buckets along the path, concurrency, OpenAI's headers, a simulated clock."""

from __future__ import annotations

import asyncio

import pytest

from helpers.ops_factory import FakeClock, add_key, make_guard, request
from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.guard import SettledUsage
from tokenomy.gateway.ops.tenancy import NodeLimits
from tokenomy.gateway.stores.limits import openai_duration


def test_rpm_refuses_with_429_retry_after_and_refills_with_time(tmp_path):
    clock = FakeClock()
    guard = make_guard(tmp_path, clock)
    raw, _ = add_key(guard, key=NodeLimits(rpm=2))
    first = asyncio.run(guard.admit(request(raw, "r1")))
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    asyncio.run(guard.admit(request(raw, "r2")))
    with pytest.raises(GatewayError) as err:
        asyncio.run(guard.admit(request(raw, "r3")))
    e = err.value
    assert (e.status, e.code, e.type) == (429, "rate_limit_rpm", "rate_limit_error")
    assert e.headers["retry-after"] == "30"  # one request refills in 60 s / 2
    assert e.headers["x-ratelimit-remaining-requests"] == "0"
    clock.advance(30.0)
    asyncio.run(guard.admit(request(raw, "r3")))


def test_tpm_is_charged_by_estimate_then_corrected_to_actual(tmp_path):
    clock = FakeClock()
    guard = make_guard(tmp_path, clock)
    raw, _ = add_key(guard, key=NodeLimits(tpm=1000))
    adm = asyncio.run(guard.admit(request(raw, "r1", prompt=100, max_tokens=500)))
    assert adm.headers["x-ratelimit-remaining-tokens"] == "400"
    with pytest.raises(GatewayError) as err:  # another 600-token estimate does not fit
        asyncio.run(guard.admit(request(raw, "r2", prompt=100, max_tokens=500)))
    assert err.value.code == "rate_limit_tpm"
    asyncio.run(guard.settle(adm, SettledUsage(prompt_tokens=100, output_tokens=20, cached_tokens=0,
                                               cost_usd=0.0001)))
    adm2 = asyncio.run(guard.admit(request(raw, "r2", prompt=100, max_tokens=500)))
    assert adm2.headers["x-ratelimit-remaining-tokens"] == "280"  # 1000 - 120 actual - 600 estimate


def test_a_request_larger_than_the_tpm_limit_is_refused_without_retry_hint(tmp_path):
    guard = make_guard(tmp_path)
    raw, _ = add_key(guard, team=NodeLimits(tpm=100))
    with pytest.raises(GatewayError) as err:
        asyncio.run(guard.admit(request(raw, "r1", prompt=80, max_tokens=80)))
    assert err.value.code == "tokens_over_limit" and "retry-after" not in err.value.headers


def test_max_concurrent_counts_requests_in_flight_until_settled_or_released(tmp_path):
    guard = make_guard(tmp_path)
    raw, _ = add_key(guard, key=NodeLimits(max_concurrent=2))
    a = asyncio.run(guard.admit(request(raw, "r1")))
    asyncio.run(guard.admit(request(raw, "r2")))
    with pytest.raises(GatewayError) as err:
        asyncio.run(guard.admit(request(raw, "r3")))
    assert err.value.code == "concurrency_limit"
    asyncio.run(guard.release(a, "client disconnected"))
    asyncio.run(guard.release(a, "client disconnected"))  # idempotent: frees one slot, not two
    asyncio.run(guard.admit(request(raw, "r3")))
    with pytest.raises(GatewayError):
        asyncio.run(guard.admit(request(raw, "r4")))


@pytest.mark.parametrize("seconds, text", [(0.02, "20ms"), (0.0, "0ms"), (1.5, "1.5s"), (360.0, "6m0s")])
def test_openai_duration_format(seconds, text):
    assert openai_duration(seconds) == text
