"""RPM/TPM token buckets and concurrency counts per tenant node, with OpenAI's rate-limit headers.

Every node on a key's path (org, team, key) has its own buckets sized by its own limits, and a
request must fit all of them: the effective limit is the minimum along the path by construction.
Acquisition is all-or-nothing: either every bucket is charged or none is (no partial charge leaks
when the team refuses after the key accepted).

TPM is charged by the estimate (prompt estimate + max_tokens) at admission and corrected to the
actual prompt + output tokens at the end (``correct_tokens``); a correction may drive a bucket
below zero, which then delays the next requests instead of being forgotten.

The same rules run in Lua for a fleet (``redis_limits.LIMITS_LUA``); both are held to one
contract through ``guard_state.GuardState`` (``tests/gateway/stores/test_guard_state.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.tenancy import NodeLimits

RPM, TPM = "requests", "tokens"


def openai_duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.5s``, ``6m0s``."""
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60.0:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{round(rest):d}s"


@dataclass(slots=True)
class TokenBucket:
    """``capacity`` units, refilled continuously at ``capacity`` per minute."""

    capacity: float
    level: float
    updated_s: float

    def refill(self, now_s: float) -> None:
        if now_s > self.updated_s:
            self.level = min(self.capacity, self.level + (now_s - self.updated_s) * self.capacity / 60.0)
            self.updated_s = now_s

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` fits (after ``refill``); inf when it never can."""
        if amount <= self.level:
            return 0.0
        if amount > self.capacity or self.capacity <= 0:
            return math.inf
        return (amount - self.level) * 60.0 / self.capacity

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return 0.0 if self.capacity <= 0 else max(0.0, self.capacity - self.level) * 60.0 / self.capacity


def concurrency_refused(node_id: str, max_concurrent: int) -> GatewayError:
    return GatewayError(429, f"too many concurrent requests for {node_id} (limit {max_concurrent})",
                        type="rate_limit_error", code="concurrency_limit", headers={"retry-after": "1"})


def never_fits(node_id: str, kind: str, amount: float, cap: int) -> GatewayError:
    """A request bigger than a whole minute of the bucket: no retry helps."""
    return GatewayError(429, f"request needs {int(amount)} {kind} but {node_id} allows {cap} per minute",
                        type="rate_limit_error", code=f"{kind}_over_limit")


def rate_limited(node_id: str, kind: str, cap: int, wait_s: float, headers: dict[str, str]) -> GatewayError:
    return GatewayError(429, f"rate limit reached for {node_id}: {cap} {kind} per minute", type="rate_limit_error",
                        code="rate_limit_rpm" if kind == RPM else "rate_limit_tpm",
                        headers={"retry-after": str(max(1, math.ceil(wait_s))), **headers})


def headers_of(buckets: Sequence[tuple[float, int, str]]) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` for the tightest bucket of each kind (the lowest level, then the
    smallest capacity), from (level, capacity, kind) triples."""
    out: dict[str, str] = {}
    for kind, names in _HEADER_NAMES:
        best: tuple[float, int] | None = None
        for level, cap, k in buckets:
            if k == kind and (best is None or (level, cap) < best):
                best = (level, cap)
        if best is not None:
            level, cap = best
            out[names[0]] = str(cap)
            out[names[1]] = str(max(0, math.floor(level)))
            out[names[2]] = openai_duration(0.0 if cap <= 0 else max(0.0, cap - level) * 60.0 / cap)
    return out


_HEADER_NAMES = tuple((kind, (f"x-ratelimit-limit-{kind}", f"x-ratelimit-remaining-{kind}",
                              f"x-ratelimit-reset-{kind}")) for kind in (RPM, TPM))

_Plan = list[tuple[TokenBucket, float, int, str]]  # (bucket, amount, capacity, kind)


class InProcessRateLimits:
    """The buckets and slots in one process's memory. ``check`` then ``charge`` is the atomic
    step; the caller (``local_state.LocalState``) runs both under its lock."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._in_flight: dict[str, int] = {}

    def _bucket(self, node_id: str, kind: str, capacity: int, now_s: float) -> TokenBucket:
        bucket = self._buckets.get((node_id, kind))
        if bucket is None or bucket.capacity != capacity:
            # new, or the limit changed: start full (new) or keep what was used (changed)
            used = 0.0 if bucket is None else bucket.capacity - bucket.level
            bucket = TokenBucket(float(capacity), float(capacity) - used, now_s)
            self._buckets[(node_id, kind)] = bucket
        bucket.refill(now_s)
        return bucket

    def check(self, path: Sequence[tuple[str, NodeLimits]], tokens: int, now_s: float) -> _Plan:
        """What one request and ``tokens`` would charge on every node of ``path``; raises the 429
        of the first node that refuses. Changes nothing but refills."""
        plan: _Plan = []
        for node_id, lim in path:
            if lim.max_concurrent is not None and self._in_flight.get(node_id, 0) >= lim.max_concurrent:
                raise concurrency_refused(node_id, lim.max_concurrent)
            for kind, cap, amount in ((RPM, lim.rpm, 1.0), (TPM, lim.tpm, float(tokens))):
                if cap is None:
                    continue
                bucket = self._bucket(node_id, kind, cap, now_s)
                wait = bucket.wait_s(amount)
                if math.isinf(wait):
                    raise never_fits(node_id, kind, amount, cap)
                if wait > 0:
                    raise rate_limited(node_id, kind, cap, wait, self._headers(path, now_s))
                plan.append((bucket, amount, cap, kind))
        return plan

    def charge(self, plan: _Plan, node_ids: Sequence[str]) -> dict[str, str]:
        """Charge ``check``'s plan and take a slot on every node; the response's headers."""
        for bucket, amount, _, _ in plan:
            bucket.level -= amount
        for node_id in node_ids:
            self._in_flight[node_id] = self._in_flight.get(node_id, 0) + 1
        return headers_of([(b.level, cap, kind) for b, _, cap, kind in plan])

    def _headers(self, path: Sequence[tuple[str, NodeLimits]], now_s: float) -> dict[str, str]:
        buckets = []
        for node_id, lim in path:
            for kind, cap in ((RPM, lim.rpm), (TPM, lim.tpm)):
                if cap is not None:
                    buckets.append((self._bucket(node_id, kind, cap, now_s).level, cap, kind))
        return headers_of(buckets)

    def correct_tokens(self, node_ids: Sequence[str], estimate: int, actual_tokens: int, now_s: float) -> None:
        """Replace the TPM ``estimate`` charged on ``node_ids`` with ``actual_tokens``."""
        delta = float(actual_tokens - estimate)
        for node_id in node_ids:
            bucket = self._buckets.get((node_id, TPM))
            if bucket is not None:
                bucket.refill(now_s)
                bucket.level = min(bucket.capacity, bucket.level - delta)

    def finish(self, node_ids: Sequence[str]) -> None:
        for node_id in node_ids:
            self._in_flight[node_id] = max(0, self._in_flight.get(node_id, 0) - 1)
