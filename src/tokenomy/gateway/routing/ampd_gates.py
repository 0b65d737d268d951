"""AMPD's live gates: turns waiting in the gateway until a policy releases them.

* :class:`GatedPrefillQueue`: remote prefills waiting for one prefill backend, released by
  ``PrefillDispatch`` (look-ahead reordering with its deferral cap);
* :class:`DecodeGate`: turns waiting to be sent to one decode backend while it is memory-full,
  released by ``SlackAdmission``.

Both are the live counterparts of the simulator's queues in front of its engines
(``sim/deployments/prefill_queue.py``, ``decode_queue.py``); :mod:`tokenomy.gateway.routing.ampd_live`
feeds them views and awaits them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Generic, Protocol, TypeVar

from tokenomy.core import SLO
from tokenomy.gateway.routing.backends import Backend
from tokenomy.policy.ampd import AdmissionTask, PrefillDispatch, PrefillTask, SlackAdmission


class _Task(Protocol):
    @property
    def request_id(self) -> str: ...


TaskT = TypeVar("TaskT", bound=_Task)


class _Gate(Generic[TaskT]):
    """Tasks waiting for a policy to release them, each awaited by its request's handler;
    ``pump`` (a subclass's) applies the policy's decisions through :meth:`_release`."""

    def __init__(self) -> None:
        self.tasks: list[TaskT] = []
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self.held = 0  # tasks that had to wait (not released at once)

    async def acquire(self, task: TaskT) -> None:
        """Wait until ``task`` is released; a cancelled wait leaves the gate."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.tasks.append(task)
        self._waiters[task.request_id] = fut
        self.pump()
        if not fut.done():
            self.held += 1
        try:
            await fut
        except BaseException:
            if task in self.tasks:
                self.tasks.remove(task)
            self._waiters.pop(task.request_id, None)
            self._left(task.request_id)
            raise

    def _release(self, index: int) -> TaskT:
        task = self.tasks.pop(index)
        fut = self._waiters.pop(task.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)
        return task

    def pump(self) -> None:
        raise NotImplementedError

    def _left(self, request_id: str) -> None:
        """A waiting (or released) task's request gave up."""


class GatedPrefillQueue(_Gate[PrefillTask]):
    """Remote prefills waiting for one prefill backend; ``PrefillDispatch`` releases them."""

    def __init__(self, dispatch: PrefillDispatch, instance_id: str) -> None:
        super().__init__()
        self.dispatch = dispatch
        self.instance_id = instance_id
        self.released: dict[str, int] = {}  # request id -> prompt tokens, released and not answered

    @property
    def queued_tokens(self) -> int:
        return sum(t.new_tokens for t in self.tasks) + sum(self.released.values())

    def _left(self, request_id: str) -> None:
        self.done(request_id)

    def done(self, request_id: str) -> None:
        """The released prefill answered (or failed): its tokens leave the backend's budget."""
        if self.released.pop(request_id, None) is not None:
            self.pump()

    @property
    def engine_waiting_tokens(self) -> int:
        """Released tokens the engine has not started: all but the oldest released prefill's (the
        engine runs them first come, first served; the oldest one is computing). The simulator
        reads its engine's waiting tokens here; the gateway cannot see them."""
        return sum(self.released.values()) - next(iter(self.released.values()), 0)

    def pump(self) -> None:
        while True:
            d = self.dispatch.decide(self.tasks, engine_waiting_tokens=self.engine_waiting_tokens,
                                     in_flight_tokens=0, now=time.monotonic(), prefill_instance=self.instance_id)
            if d is None:
                return
            task = self._release(d.index)
            self.released[task.request_id] = task.new_tokens


class DecodeGate(_Gate[AdmissionTask]):
    """Turns waiting to be sent to one decode backend; ``SlackAdmission`` releases them.

    The live counterpart of the simulator's ``DecodeAdmissionQueue``. The engine's waiting
    requests are the turns this gate released that have no first token yet (the gateway sees
    each one's first token, or its end); a released turn that never reaches the backend (its
    client left) stops counting after ``stale_s``.
    """

    def __init__(self, admission: SlackAdmission, backend: Backend, slo: SLO, stale_s: float) -> None:
        super().__init__()
        self.admission = admission
        self.backend = backend
        self.slo = slo
        self.stale_s = stale_s
        self.released: dict[str, tuple[int, float]] = {}  # request id -> (blocks, released at)
        self.reordered = 0  # releases that overtook an older waiting turn

    def _left(self, request_id: str) -> None:
        self.progress(request_id)

    def progress(self, request_id: str | None) -> None:
        """``request_id`` got its first token or left the backend (memory may have freed), or
        None: a scrape refreshed the backend's free KV. Pumps."""
        if request_id is not None:
            self.released.pop(request_id, None)
        self.pump()

    def pump(self) -> None:
        now = time.monotonic()
        for rid in [r for r, (_, t) in self.released.items() if now - t > self.stale_s]:
            del self.released[rid]
        while self.tasks:
            d = self.admission.decide(
                self.tasks, engine_waiting=len(self.released),
                engine_waiting_blocks=sum(b for b, _ in self.released.values()),
                free_blocks=self.backend.free_blocks, slo=self.slo, now=now,
                decode_instance=self.backend.instance_id)
            if d is None:
                return
            self.reordered += d.index > 0
            task = self._release(d.index)
            self.released[task.request_id] = (task.blocks, now)
