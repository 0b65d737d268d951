"""KV an emulated instance keeps after its request finished, each pin with a timer that unpins it:
a prefill answer's KV until the decode side pulls it (P/D), or a request's KV for a gateway's
retention hint (``RETAIN_PATH``)."""

from __future__ import annotations

import asyncio
from contextlib import suppress

from tokenomy.emulator.driver import EngineDriver
from tokenomy.engine import Engine

RETAIN_PATH = "/v1/tokenomy/retain"
"""Extension: ``{"request_id": <the x-request-id of a coming request>, "ttl_s": s}`` pins that
request's KV for ``ttl_s`` modelled seconds after it finishes (a gateway's retention hint);
``ttl_s: 0`` for a request whose KV is pinned now releases it at once (the gateway's pressure relief)."""

_RETAIN_HINTS = 10_000  # pending hints remembered (oldest forgotten first)


class KVPins:
    """The pinned requests of one engine, the pending retention hints, and their timers."""

    def __init__(self, engine: Engine, driver: EngineDriver, time_scale: float) -> None:
        self._engine = engine
        self._driver = driver
        self._time_scale = time_scale
        self._held: dict[str, asyncio.TimerHandle] = {}  # KV kept for a decode instance or by a hint
        self._retain_hints: dict[str, float] = {}  # client request id -> ttl_s
        self._pinned_by_client: dict[str, str] = {}  # client request id -> engine id of a pin (latest _RETAIN_HINTS)
        self.retained_total = 0  # requests pinned after finishing by a retention hint

    def hint(self, client_request_id: str, ttl_s: float) -> None:
        """Pin the KV of the coming request with this x-request-id for ``ttl_s`` after it finishes;
        ``ttl_s`` 0 releases the pin of a finished one (and forgets a hint not yet used)."""
        if ttl_s == 0:
            self._retain_hints.pop(client_request_id, None)
            job_id = self._pinned_by_client.pop(client_request_id, None)
            if job_id is not None:
                self.release(job_id)
            return
        self._retain_hints[client_request_id] = ttl_s
        while len(self._retain_hints) > _RETAIN_HINTS:
            self._retain_hints.pop(next(iter(self._retain_hints)))

    def take_hint(self, client_request_id: str) -> float | None:
        """The ``ttl_s`` hinted for a request that starts now (the hint is used up), or ``None``."""
        return self._retain_hints.pop(client_request_id, None)

    def hold(self, request_id: str, modelled_s: float) -> None:
        """Keep a finished request's (already retained) KV for ``modelled_s``, then release it."""
        self._held[request_id] = asyncio.get_running_loop().call_later(
            modelled_s * self._time_scale, self.release, request_id)

    def keep_hinted(self, request_id: str, client_request_id: str, ttl_s: float, *, aborted: bool) -> None:
        """A request that took a hint finished: hold its KV ``ttl_s`` (an aborted one's is freed now)."""
        if aborted:
            with suppress(ValueError):  # an aborted request may hold no pinned KV
                self._engine.release(request_id)
                self._driver.kick()
            return
        self.retained_total += 1
        self.hold(request_id, ttl_s)
        self._pinned_by_client[client_request_id] = request_id
        while len(self._pinned_by_client) > _RETAIN_HINTS:  # expired pins' entries age out
            self._pinned_by_client.pop(next(iter(self._pinned_by_client)))

    def release(self, request_id: str) -> bool:
        """Unpin held KV (a decode instance pulled it, a hint was withdrawn, or the timer ran out)."""
        timer = self._held.pop(request_id, None)
        if timer is None:
            return False
        timer.cancel()
        self._engine.release(request_id)
        self._driver.kick()  # the freed blocks may admit a request that waits for KV
        return True

    def close(self) -> None:
        for timer in self._held.values():
            timer.cancel()
