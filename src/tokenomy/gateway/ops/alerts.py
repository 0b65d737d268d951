"""Alerts: a log line each, and a webhook JSON POST that never blocks the request path.

``Alerter.emit`` logs and puts the alert on a bounded queue; one background task posts queued
alerts to ``webhook_url`` in order. A full queue drops the alert (counted in ``dropped``) rather
than slow a request; a failed POST is logged and not retried (alerts are advisory; the ledger is
the record). Body: ``{"kind", "subject", "message", "at_s", "data"}``.

Kinds: ``budget_threshold`` (a node's spend crossed 50/80/100% of its period budget),
``breaker_trip`` and ``spend_rate`` (a key spending faster than ``spend_rate_usd_per_hour``, or
``spend_rate_factor`` times its own baseline).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("tokenomy.gateway.ops.alerts")


class AlertsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    webhook_url: str | None = Field(default=None, pattern=r"^https?://")
    queue_size: int = Field(default=1000, ge=1)
    timeout_s: float = Field(default=2.0, gt=0)
    budget_thresholds: tuple[float, ...] = (0.5, 0.8, 1.0)
    spend_rate_usd_per_hour: float | None = Field(default=None, gt=0, description="absolute alert threshold")
    spend_rate_window_s: float = Field(default=300.0, gt=0)
    spend_rate_factor: float | None = Field(default=None, gt=1, description="alert when the window's rate "
                                            "passes this multiple of the key's own baseline")
    spend_baseline_s: float = Field(default=6 * 3600.0, gt=0, description="baseline time constant (and warm-up)")
    spend_rate_min_usd_per_hour: float = Field(default=0.1, ge=0, description="no relative alert below this rate")


@dataclass(frozen=True, slots=True)
class Alert:
    kind: str
    subject: str
    message: str
    at_s: float
    data: dict[str, Any] = field(default_factory=dict)


Poster = Callable[[str, dict[str, Any]], Awaitable[None]]


async def _httpx_post(url: str, body: dict[str, Any], timeout_s: float) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=timeout_s) as client:
        (await client.post(url, json=body)).raise_for_status()


class Alerter:
    """Logs every alert; posts them to the webhook from one background task."""

    def __init__(self, config: AlertsConfig, post: Poster | None = None) -> None:
        self.config = config
        self._post: Poster = post or (lambda url, body: _httpx_post(url, body, config.timeout_s))
        self._queue: asyncio.Queue[Alert] | None = None
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self.recent: deque[Alert] = deque(maxlen=100)

    def emit(self, alert: Alert) -> None:
        """Never blocks, never raises."""
        log.warning("alert %s %s: %s", alert.kind, alert.subject, alert.message)
        self.recent.append(alert)
        if self.config.webhook_url is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.dropped += 1  # no event loop (a CLI call): the log line is all
            return
        if self._queue is None:
            self._queue = asyncio.Queue(self.config.queue_size)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._worker(self._queue, self.config.webhook_url))
        try:
            self._queue.put_nowait(alert)
        except asyncio.QueueFull:
            self.dropped += 1

    async def _worker(self, queue: asyncio.Queue[Alert], url: str) -> None:
        while True:
            alert = await queue.get()
            try:
                await self._post(url, asdict(alert))
                self.sent += 1
            except Exception as exc:  # a webhook failure must never reach a request
                self.failed += 1
                log.error("alert webhook %s failed: %s", url, exc)
            finally:
                queue.task_done()

    async def drain(self) -> None:
        """Wait until every queued alert was posted (for shutdown and tests)."""
        if self._queue is not None and self._task is not None and not self._task.done():
            await self._queue.join()

    async def close(self) -> None:
        await self.drain()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class SpendRateMonitor:
    """Spend per key in a sliding window, against an absolute threshold and against the key's own
    baseline (an exponentially weighted rate with time constant ``baseline_s``).

    ``add`` returns ``(rate_usd_per_hour, reason)`` when a key newly becomes anomalous: its window
    rate passes ``usd_per_hour``, or — once the key has been seen for ``baseline_s`` — passes
    ``factor`` times its baseline (and ``min_usd_per_hour``). One alert per episode: the key is
    quiet until its rate falls back under the thresholds.
    """

    def __init__(self, usd_per_hour: float | None, window_s: float, factor: float | None = None,
                 baseline_s: float = 6 * 3600.0, min_usd_per_hour: float = 0.0) -> None:
        self.usd_per_hour = usd_per_hour
        self.window_s = window_s
        self.factor = factor
        self.baseline_s = baseline_s
        self.min_usd_per_hour = min_usd_per_hour
        self._events: dict[str, deque[tuple[float, float]]] = {}
        self._totals: dict[str, float] = {}
        self._baseline: dict[str, tuple[float, float, float]] = {}  # key -> (rate $/h, at_s, first_s)
        self._alerting: set[str] = set()

    def add(self, key_id: str, usd: float, now_s: float) -> tuple[float, str] | None:
        if self.usd_per_hour is None and self.factor is None:
            return None
        events = self._events.setdefault(key_id, deque())
        events.append((now_s, usd))
        total = self._totals.get(key_id, 0.0) + usd
        while events and events[0][0] <= now_s - self.window_s:
            total -= events.popleft()[1]
        self._totals[key_id] = total
        rate = total * 3600.0 / self.window_s
        base, at_s, first_s = self._baseline.get(key_id, (0.0, now_s, now_s))
        reason = None
        if self.usd_per_hour is not None and rate > self.usd_per_hour:
            reason = f"above the ${self.usd_per_hour:.2f}/h threshold"
        elif (self.factor is not None and now_s - first_s >= self.baseline_s
              and rate > max(self.factor * base, self.min_usd_per_hour)):
            reason = f"{rate / base:.1f}x its baseline of ${base:.2f}/h" if base > 0 else "from a zero baseline"
        decay = math.exp(-(now_s - at_s) / self.baseline_s)
        self._baseline[key_id] = (base * decay + usd * 3600.0 / self.baseline_s, now_s, first_s)
        if reason is None:
            self._alerting.discard(key_id)
            return None
        if key_id in self._alerting:
            return None
        self._alerting.add(key_id)
        return rate, reason
