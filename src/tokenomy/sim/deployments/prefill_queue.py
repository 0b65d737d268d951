"""A prefill instance's queue held in front of its engine, so that AMPD can reorder it.

The engine keeps about one step of work (``max_num_batched_tokens`` prompt tokens) in its own
FCFS queue, so batching is not starved; everything beyond that waits here, where the
look-ahead reorder policy picks what goes next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tokenomy.policy.ampd import LookaheadReorder, PrefillTask
from tokenomy.sim.instance import SimInstance

Dispatch = Callable[[float], None]


@dataclass(slots=True)
class _Queued:
    task: PrefillTask
    dispatch: Dispatch


class PrefillQueue:
    """Tasks waiting for one prefill instance; ``pump`` releases them to the engine."""

    def __init__(self, instance: SimInstance, reorder: LookaheadReorder | None, budget_tokens: int) -> None:
        self.instance = instance
        self._reorder = reorder
        self._budget = budget_tokens
        self._items: list[_Queued] = []
        self.queued_tokens = 0
        self.in_flight_tokens = 0  # dispatched, KV of the history still travelling to the engine

    def __len__(self) -> int:
        return len(self._items)

    def push(self, task: PrefillTask, dispatch: Dispatch, now: float) -> None:
        self._items.append(_Queued(task, dispatch))
        self.queued_tokens += task.new_tokens
        self.pump(now)

    def backlog_tokens(self) -> int:
        """Prompt tokens waiting for this instance, here, in flight and in the engine."""
        return self.queued_tokens + self.in_flight_tokens + self.instance.engine.num_waiting_tokens

    def pump(self, now: float) -> None:
        engine = self.instance.engine
        while self._items and engine.num_waiting_tokens + self.in_flight_tokens < self._budget:
            index = 0 if self._reorder is None else self._reorder.pick([q.task for q in self._items], now)
            item = self._items.pop(index)
            self.queued_tokens -= item.task.new_tokens
            item.dispatch(now)
