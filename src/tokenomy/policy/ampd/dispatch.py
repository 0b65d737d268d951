"""Prefill dispatch: when a prefill instance's queue releases its next task, and which one.

A prefill instance's engine keeps about one step of prompt tokens in its own FCFS queue, so its
batches are not starved; the rest waits in a queue in front of it (in the simulator, or in the
gateway), where the look-ahead reorder policy can still choose. ``decide`` gates and picks:

* **gate**: release a task only while the engine's waiting prompt tokens plus the tokens already
  released but still on their way (history KV in transfer) stay below ``engine_budget_tokens``
  (our default: one full prefill step, vLLM's ``max_num_batched_tokens`` 8192);
* **pick**: the task :class:`~tokenomy.policy.ampd.reorder.LookaheadReorder` chooses, or the head
  (FCFS) without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenomy.policy.ampd.reorder import LookaheadReorder, PrefillTask
from tokenomy.policy.trace import TraceSink, emit, fields_dict


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """``engine_budget_tokens``: prompt tokens the engine may hold queued before the next release."""

    engine_budget_tokens: int = 8192

    def __post_init__(self) -> None:
        if self.engine_budget_tokens < 1:
            raise ValueError(f"engine_budget_tokens must be >= 1, got {self.engine_budget_tokens}")


@dataclass(frozen=True, slots=True)
class DispatchDecision:
    """Release ``queue[index]`` (``request_id``) to the engine now; ``overtaken`` tasks were ahead of it."""

    index: int
    request_id: str
    overtaken: int
    reason: str
    prefill_instance: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, for the decision trace."""
        return fields_dict(self)


class PrefillDispatch:
    """Gates a prefill queue on the engine's backlog and picks the next task (module docstring)."""

    def __init__(
        self, config: DispatchConfig, reorder: LookaheadReorder | None, *, trace: TraceSink | None = None
    ) -> None:
        self.config = config
        self.reorder = reorder
        self.trace = trace

    def decide(
        self,
        queue: Sequence[PrefillTask],
        *,
        engine_waiting_tokens: int,
        in_flight_tokens: int,
        now: float,
        prefill_instance: str = "",
    ) -> DispatchDecision | None:
        """The next task to release, or None (empty queue, or the engine has enough work).

        A release through the reorder policy counts one deferral on every task it overtakes.
        Releases (not refusals) go to the trace sink.
        """
        decision = self._decide(queue, engine_waiting_tokens, in_flight_tokens, now, prefill_instance)
        if decision is not None:
            emit(self.trace, "dispatch", now, decision)
        return decision

    def _decide(
        self, queue: Sequence[PrefillTask], engine_waiting_tokens: int, in_flight_tokens: int, now: float, pid: str
    ) -> DispatchDecision | None:
        if not queue or engine_waiting_tokens + in_flight_tokens >= self.config.engine_budget_tokens:
            return None
        if self.reorder is None:
            return DispatchDecision(0, queue[0].request_id, 0, "fcfs", pid)
        tasks = queue if isinstance(queue, list) else list(queue)  # pick reads it, and counts deferrals
        index = self.reorder.pick(tasks, now)
        task = tasks[index]
        if index == 0:
            why = "head"
        elif task.deferrals >= self.reorder.config.max_deferrals:
            why = "deferral cap reached"
        else:
            why = "meets more deadlines in the look-ahead window"
        return DispatchDecision(index, task.request_id, index, why, pid)
