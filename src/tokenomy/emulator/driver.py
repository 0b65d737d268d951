"""The wall-clock driver: one :class:`Engine` stepped on an asyncio loop.

The engine never reads a clock; this driver gives it one. Modelled time is
``(loop.time() - t0) / time_scale``. While the engine has work, step ``k + 1`` starts at the
modelled end of step ``k`` (not at the wall time the loop got round to it), and the driver sleeps
until the wall time of that end before it delivers the step's tokens. So Python overhead does
not add up: a late wake-up shortens the next sleep. Only when the wall clock falls more than
``max_lag_s`` behind the model (CPU saturated, a long pause) does the next step start at
``now - max_lag_s`` instead, and the skipped modelled time is counted in ``lag_dropped_s``.
An idle engine costs nothing: the driver awaits an event until a request arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tokenomy.core import Request
from tokenomy.engine import Engine, FinishedRequest, StepResult


class EngineStopped(RuntimeError):
    """The engine driver stopped (crashed or shut down) before the request completed."""


class RequestHandle:
    """A request's live state as the server sees it; the driver updates it at each step end.

    ``emitted``: output tokens delivered so far; ``finished``: the engine's record once the
    request left the engine (completed or aborted). Wall times are ``loop.time()`` values.
    """

    __slots__ = ("request_id", "arrival_wall", "first_token_wall", "last_token_wall", "emitted",
                 "finished", "prompt_tokens", "finish_reason", "error", "_waiter", "_news")

    def __init__(self, request_id: str, arrival_wall: float) -> None:
        self.request_id = request_id
        self.arrival_wall = arrival_wall
        self.first_token_wall: float | None = None
        self.last_token_wall = arrival_wall
        self.emitted = 0
        self.finished: FinishedRequest | None = None
        self.prompt_tokens = 0  # set by the server, for metrics
        self.finish_reason = "length"
        self.error: EngineStopped | None = None  # set when the driver stopped with this request in flight
        self._waiter: asyncio.Future[None] | None = None
        self._news = False

    async def wait(self) -> None:
        """Return once something new happened (tokens, finish) since the previous call.

        Raises :class:`EngineStopped` once the driver stopped with this request unfinished."""
        if not self._news:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        self._news = False
        if self.error is not None:
            raise self.error

    def _wake(self) -> None:
        self._news = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


TokenHook = Callable[[RequestHandle, float], None]
"""Called per delivered token with the handle (before its counters change) and the wall time."""
FinishHook = Callable[[RequestHandle, FinishedRequest], None]


class EngineDriver:
    """Runs :meth:`run` as a task; :meth:`submit`/:meth:`abort` from request handlers."""

    def __init__(
        self,
        engine: Engine,
        *,
        time_scale: float = 1.0,
        max_lag_s: float = 0.02,
        on_token: TokenHook | None = None,
        on_finish: FinishHook | None = None,
    ) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.max_lag_s = max_lag_s
        self._on_token = on_token
        self._on_finish = on_finish
        self._handles: dict[str, RequestHandle] = {}
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._next_start: float | None = None
        self._last_end = float("-inf")
        self._idle_arrival: float | None = None  # earliest modelled arrival submitted while idle
        self.stopped = False
        self.lag_dropped_s = 0.0
        self.steps = 0
        self.busy_s = 0.0

    def model_now(self) -> float:
        return (self._loop.time() - self._t0) / self.time_scale

    # ---- from request handlers ------------------------------------------------------------
    def submit(self, request: Request, arrival_wall: float | None = None, **kwargs: object) -> RequestHandle:
        """Queue ``request`` on the engine now (keyword arguments as :meth:`Engine.add_request`).

        ``arrival_wall``: when the request reached the server (before parsing and tokenizing). An
        idle engine starts its next step at that time's model equivalent (at most ``max_lag_s`` in
        the past), so the server's own CPU work does not add to the modelled TTFT.
        Raises ValueError as ``add_request`` does (the request never entered the engine), and
        :class:`EngineStopped` once :meth:`run` has ended."""
        if self.stopped:
            raise EngineStopped("the engine is not running")
        self.engine.add_request(request, self.model_now(), **kwargs)  # type: ignore[arg-type]
        if arrival_wall is not None and self._next_start is None:
            arrival = (arrival_wall - self._t0) / self.time_scale
            self._idle_arrival = arrival if self._idle_arrival is None else min(self._idle_arrival, arrival)
        handle = RequestHandle(request.request_id, self._loop.time())
        self._handles[request.request_id] = handle
        self._wake.set()
        return handle

    def abort(self, request_id: str) -> FinishedRequest | None:
        """Stop a request (client gone): its KV is freed now. None if it already left."""
        handle = self._handles.pop(request_id, None)
        fin = self.engine.abort(request_id, self.model_now())
        if handle is not None and fin is not None:
            handle.finished = fin
            handle._wake()
        self.kick()
        return fin

    def kick(self) -> None:
        """Step again if idle: KV was freed from outside (an abort, a released retention pin).

        An idle engine whose waiting head did not fit the free KV sleeps until something changes;
        without this it would sleep until the next request arrives, however long that takes.
        """
        self._wake.set()

    # ---- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        """Step the engine forever (cancel the task to stop).

        However it ends (cancelled, or an exception from the engine), every request still in
        flight is failed with :class:`EngineStopped`, so no handler waits forever, and later
        :meth:`submit` calls raise it at once."""
        try:
            await self._steps()
        finally:
            self.stopped = True
            error = EngineStopped("the engine stopped before the request completed")
            handles, self._handles = self._handles, {}
            for handle in handles.values():
                handle.error = error
                handle._wake()

    async def _steps(self) -> None:
        engine, sleep = self.engine, asyncio.sleep
        while True:
            now = self.model_now()
            start = self._next_start
            if start is None:
                start = now
                if self._idle_arrival is not None:
                    start = min(now, max(self._idle_arrival, now - self.max_lag_s, self._last_end))
                    self._idle_arrival = None
            elif now - start > self.max_lag_s:
                self.lag_dropped_s += now - self.max_lag_s - start
                start = now - self.max_lag_s
            # Invariant: a step never starts before the previous one ended. The wall clock can read
            # a little before ``_last_end`` (the loop's timer wakes up to ~1 ms early), and the
            # engine refuses an overlapping step, which would stop this loop for good.
            start = max(start, self._last_end)
            result = engine.step(start)
            if result is None:
                self._next_start = None
                self._wake.clear()
                await self._wake.wait()
                continue
            end = result.end_s
            self._next_start = self._last_end = end
            self.steps += 1
            self.busy_s += result.duration_s
            # Always yield, even when late: the handlers must get to write the previous tokens.
            await sleep(max(0.0, (end - self.model_now()) * self.time_scale))
            engine.end_step()
            self._deliver(result)

    def _deliver(self, result: StepResult) -> None:
        handles = self._handles
        wall = self._loop.time()
        on_token = self._on_token
        for rid in result.emitted:
            h = handles.get(rid)
            if h is None:
                continue  # aborted while the step ran
            if on_token is not None:
                on_token(h, wall)
            if h.first_token_wall is None:
                h.first_token_wall = wall
            h.last_token_wall = wall
            h.emitted += 1
            h._wake()
        for fin in result.finished:
            h = handles.pop(fin.request_id, None)
            if h is None:
                continue
            h.finished = fin
            if self._on_finish is not None:
                self._on_finish(h, fin)
            h._wake()
