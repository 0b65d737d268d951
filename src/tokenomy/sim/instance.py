"""An engine instance driven by the event loop."""

from __future__ import annotations

from collections.abc import Callable

from tokenomy.core import Request
from tokenomy.engine import Engine, StepResult
from tokenomy.sim.loop import EventLoop

ResultHandler = Callable[["SimInstance", StepResult], None]


class SimInstance:
    """Steps one :class:`Engine` back to back while it has work.

    The engine schedules and applies a step at its start time and reports what happened at
    its end; this wrapper delivers the result at ``end_s`` and immediately starts the next
    step, like a real engine's busy loop. Requests added while a step is in flight wait for
    the next one, as in vLLM.
    """

    __slots__ = ("engine", "_loop", "_on_result", "_busy", "busy_s", "flops", "steps")

    def __init__(self, engine: Engine, loop: EventLoop, on_result: ResultHandler) -> None:
        self.engine = engine
        self._loop = loop
        self._on_result = on_result
        self._busy = False
        self.busy_s = 0.0
        self.flops = 0.0
        self.steps = 0

    @property
    def instance_id(self) -> str:
        return self.engine.instance_id

    def submit(self, request: Request, now: float, **kwargs: object) -> None:
        """Queue a request on the engine (keyword arguments as :meth:`Engine.add_request`)."""
        self.engine.add_request(request, now, **kwargs)  # type: ignore[arg-type]
        self.kick(now)

    def kick(self, now: float) -> None:
        """Start stepping if idle (after work was added from outside)."""
        if not self._busy:
            self._busy = True
            self._loop.at(now, self._step)

    def _step(self) -> None:
        now = self._loop.now
        result = self.engine.step(now)
        if result is None:
            self._busy = False
            return
        self.busy_s += result.duration_s
        self.flops += result.flops
        self.steps += 1
        self._loop.at(result.end_s, self._finish_step, result)

    def _finish_step(self, result: StepResult) -> None:
        self._on_result(self, result)
        self._step()
