"""A tenant's consumption rate over a sliding window, on a clock it is given (never read)."""

from __future__ import annotations

from collections import deque


class ConsumptionMeter:
    """Tokens per second each tenant consumed over the last ``window_s`` seconds.

    ``add(tenant, tokens, now)`` records a consumption at ``now`` (calls come in time order);
    ``tokens_per_s(tenant, now)`` is the tokens recorded in ``(now - window_s, now]`` over
    ``window_s``. ``total(tenant)`` is everything ever recorded (what a budget is charged).
    """

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._events: dict[str, deque[tuple[float, int]]] = {}
        self._in_window: dict[str, int] = {}
        self._total: dict[str, int] = {}

    def add(self, tenant: str, tokens: int, now: float) -> None:
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        self._events.setdefault(tenant, deque()).append((now, tokens))
        self._in_window[tenant] = self._in_window.get(tenant, 0) + tokens
        self._total[tenant] = self._total.get(tenant, 0) + tokens

    def tokens_per_s(self, tenant: str, now: float) -> float:
        events = self._events.get(tenant)
        if not events:
            return 0.0
        while events and events[0][0] <= now - self.window_s:
            self._in_window[tenant] -= events.popleft()[1]
        return self._in_window[tenant] / self.window_s

    def total(self, tenant: str) -> int:
        return self._total.get(tenant, 0)
