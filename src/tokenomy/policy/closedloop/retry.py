"""How a client answers a refusal: retry after the ``retry-after`` it was given, a bounded number
of times, then give up (docs/closed-loop.md, "Retries").

Agent clients built on the OpenAI or Anthropic SDKs do not end a session on a 429 or a 503: the
SDK sends the request again after the ``retry-after`` the server gave (or an exponential backoff
when it gave none), up to ``max_retries`` times, unless the server said ``x-should-retry:
false``. :class:`RetryPolicy` is that rule as one pure object, applied by ``tokenomy bench`` to
the answers it gets and by the simulator's admission gate to the refusals it makes, so both runs
of a closed-loop study see the same clients. A turn refused past its last retry is *abandoned*:
its session ends there (the next turn's history would lack its answer).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

RETRY_STATUSES: tuple[str, ...] = ("429", "503")
"""Statuses a gateway refuses a request with (rate limit or budget; overload): the ones retried."""
RETRY_COUNT_HEADER = "x-stainless-retry-count"
"""The header in which the OpenAI and Anthropic SDKs send a request's attempt number (0: the first;
1 and up: retries): the closed loop's admission queues retries behind first attempts."""


@dataclass(frozen=True)
class RetryPolicy:
    """A client's retries of a refused request (every figure a labelled default).

    * ``max_retries`` 2, ``initial_backoff_s`` 0.5, ``max_backoff_s`` 8.0 and ``max_retry_after_s``
      60: the OpenAI Python SDK's defaults (``_constants.py``: ``DEFAULT_MAX_RETRIES``,
      ``INITIAL_RETRY_DELAY``, ``MAX_RETRY_DELAY``; ``_base_client.py`` honours a ``retry-after`` of
      at most 60 s, else backs off ``initial x 2^n`` capped at the max). The SDK adds up to 25%
      jitter to the backoff; this rule has none, so runs stay deterministic.
    * Only :data:`RETRY_STATUSES` are retried; ``x-should-retry: false`` (a budget spent for the
      period) is never retried. ``max_retries`` 0: a refusal ends the session at once.
    """

    max_retries: int = 2
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        for name in ("initial_backoff_s", "max_backoff_s", "max_retry_after_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")

    def delay_s(self, retries_done: int, status: str, retry_after_s: float | None,
                should_retry: bool | None = None) -> float | None:
        """Seconds to wait before sending the request again after its ``retries_done + 1``-th
        refusal with ``status``; None: give up (abandon the turn)."""
        if should_retry is False or status not in RETRY_STATUSES or retries_done >= self.max_retries:
            return None
        if retry_after_s is not None and 0 < retry_after_s <= self.max_retry_after_s:
            return retry_after_s
        return min(self.initial_backoff_s * 2.0 ** retries_done, self.max_backoff_s)

    def delay_for(self, retries_done: int, status: str, headers: Mapping[str, str]) -> float | None:
        """:meth:`delay_s` from a refusal's HTTP headers (lower-case names): ``retry-after`` in
        seconds (an HTTP date or garbage is ignored: backoff) and ``x-should-retry``."""
        raw = headers.get("retry-after")
        try:
            after = float(raw) if raw is not None else None
        except ValueError:
            after = None
        if after is not None and not math.isfinite(after):
            after = None
        flag = headers.get("x-should-retry")
        should = None if flag is None else flag.strip().lower() != "false"
        return self.delay_s(retries_done, status, after, should)
