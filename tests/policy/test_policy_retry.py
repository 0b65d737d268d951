"""How a client answers a refusal (``RetryPolicy``): after the retry-after it was given, a bounded
number of times, never when told not to."""

from __future__ import annotations

import pytest

from tokenomy.policy.closedloop import RetryPolicy


def test_a_refusal_is_retried_after_its_retry_after_until_the_retries_run_out() -> None:
    p = RetryPolicy(max_retries=2)
    assert [p.delay_s(n, "503", 1.0) for n in range(3)] == [1.0, 1.0, None]
    assert p.delay_s(0, "429", 3.0) == 3.0
    assert RetryPolicy(max_retries=0).delay_s(0, "503", 1.0) is None


def test_without_a_usable_retry_after_the_client_backs_off_exponentially() -> None:
    p = RetryPolicy(max_retries=10, initial_backoff_s=0.5, max_backoff_s=8.0, max_retry_after_s=60.0)
    assert [p.delay_s(n, "503", None) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert p.delay_s(1, "429", 120.0) == 1.0  # a retry-after past the SDK's 60 s is not waited for
    assert p.delay_s(0, "429", 0.0) == 0.5


def test_only_refusals_are_retried_and_never_when_the_server_says_not_to() -> None:
    p = RetryPolicy()
    assert p.delay_s(0, "500", 1.0) is None
    assert p.delay_s(0, "timeout", None) is None
    assert p.delay_s(0, "429", 1.0, should_retry=False) is None
    assert p.delay_for(0, "429", {"retry-after": "2", "x-should-retry": "false"}) is None
    assert p.delay_for(0, "503", {"retry-after": "2"}) == 2.0
    assert p.delay_for(0, "503", {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.5  # a date: back off
    assert p.delay_for(0, "503", {"retry-after": "nan"}) == 0.5


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_retries must be >= 0"):
        RetryPolicy(max_retries=-1)
    with pytest.raises(ValueError, match="initial_backoff_s must be a finite number"):
        RetryPolicy(initial_backoff_s=float("inf"))
