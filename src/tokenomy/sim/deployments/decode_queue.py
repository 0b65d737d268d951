"""Turns waiting to be admitted on one decode instance, held in front of its engine.

When to release a turn and which one is :class:`~tokenomy.policy.ampd.SlackAdmission`'s decision
(gate on the engine's waiting requests and free KV, slack order); this queue only applies it.
It is pumped when a turn is pushed and whenever a request on the instance finishes (memory frees).
"""

from __future__ import annotations

from collections.abc import Callable

from tokenomy.core import SLO
from tokenomy.policy.ampd import AdmissionTask, SlackAdmission
from tokenomy.sim.instance import SimInstance

Submit = Callable[[float], None]


class DecodeAdmissionQueue:
    """Turns waiting for one decode instance; ``pump`` releases them as the policy decides."""

    def __init__(self, instance: SimInstance, policy: SlackAdmission, slo: SLO) -> None:
        self.instance = instance
        self._slo = slo
        self._policy = policy
        # Held turns, oldest first: their tasks (what the policy reads, passed as is) and how to
        # release each, side by side.
        self._tasks: list[AdmissionTask] = []
        self._submits: list[Submit] = []
        self._released_blocks = 0  # blocks of turns released since the engine last had none waiting
        self.reordered = 0  # releases that overtook an older held turn

    def __len__(self) -> int:
        return len(self._tasks)

    def push(self, task: AdmissionTask, submit: Submit, now: float) -> None:
        self._tasks.append(task)
        self._submits.append(submit)
        self.pump(now)

    def pending_blocks(self) -> int:
        """Blocks of the turns held here and of those released that the engine holds unadmitted."""
        waiting = self._released_blocks if self.instance.engine.num_waiting else 0
        return waiting + sum(t.blocks for t in self._tasks)

    def held(self, request_id: str) -> AdmissionTask | None:
        """The held task of ``request_id`` (None once released or taken)."""
        return next((t for t in self._tasks if t.request_id == request_id), None)

    def take(self, request_id: str) -> bool:
        """Remove the held task of ``request_id`` (another instance serves it); False if not held."""
        for i, t in enumerate(self._tasks):
            if t.request_id == request_id:
                del self._tasks[i], self._submits[i]
                return True
        return False

    def pump(self, now: float) -> None:
        engine = self.instance.engine
        tasks = self._tasks
        while tasks:
            if engine.num_waiting == 0:
                self._released_blocks = 0
            decision = self._policy.decide(
                tasks,
                engine_waiting=engine.num_waiting,
                engine_waiting_blocks=self._released_blocks,
                free_blocks=engine.free_blocks,
                slo=self._slo,
                now=now,
                decode_instance=self.instance.instance_id,
            )
            if decision is None:
                return
            task, submit = tasks.pop(decision.index), self._submits.pop(decision.index)
            self.reordered += decision.index > 0
            self._released_blocks += task.blocks
            submit(now)
