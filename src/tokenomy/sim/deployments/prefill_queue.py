"""A prefill instance's queue held in front of its engine, so that AMPD can reorder it.

When to release a task and which one is :class:`~tokenomy.policy.ampd.PrefillDispatch`'s
decision (gate on the engine's backlog, look-ahead reordering); this queue only applies it.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenomy.policy.ampd import PrefillDispatch, PrefillTask
from tokenomy.sim.instance import SimInstance

Dispatch = Callable[[float], None]


class PrefillQueue:
    """Tasks waiting for one prefill instance; ``pump`` releases them as the policy decides."""

    def __init__(self, instance: SimInstance, policy: PrefillDispatch) -> None:
        self.instance = instance
        self._policy = policy
        # Parallel lists: the policy reads the tasks as they stand, without a copy per decision.
        self._tasks: list[PrefillTask] = []
        self._dispatches: list[Dispatch] = []
        self.queued_tokens = 0
        self.in_flight_tokens = 0  # dispatched, KV of the history still travelling to the engine

    def __len__(self) -> int:
        return len(self._tasks)

    def push(self, task: PrefillTask, dispatch: Dispatch, now: float) -> None:
        self._tasks.append(task)
        self._dispatches.append(dispatch)
        self.queued_tokens += task.new_tokens
        self.pump(now)

    def backlog_tokens(self) -> int:
        """Prompt tokens waiting for this instance, here, in flight and in the engine."""
        return self.queued_tokens + self.in_flight_tokens + self.instance.engine.num_waiting_tokens

    def pump(self, now: float) -> None:
        engine = self.instance.engine
        while True:
            decision = self._policy.decide(
                self._tasks,
                engine_waiting_tokens=engine.num_waiting_tokens,
                in_flight_tokens=self.in_flight_tokens,
                now=now,
                prefill_instance=self.instance.instance_id,
            )
            if decision is None:
                return
            task, dispatch = self._tasks.pop(decision.index), self._dispatches.pop(decision.index)
            self.queued_tokens -= task.new_tokens
            dispatch(now)
