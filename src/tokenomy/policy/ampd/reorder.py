"""AMPD prefill queue reordering: a look-ahead window over the head of a prefill queue.

Rule (docs/ampd.md, "Queue reordering"), applied to the first ``window`` tasks when the
prefill instance is free to start the next one:

1. **Starvation cap**: the first task in the window that has already been overtaken
   ``max_deferrals`` times runs now.
2. Otherwise **maximise deadlines met in the window**: Moore-Hodgson over the window — take
   the tasks in deadline order (ties: queue order), run back to back from ``now`` with
   ``estimator.prefill_time_s(new_tokens, cached_tokens)`` each, and whenever one would
   finish late drop the longest task taken so far. The earliest-deadline task of the
   surviving (feasible) set runs now; hopeless tasks thereby go after feasible ones.
3. If no task in the window can meet its deadline, the head runs (FCFS among the hopeless).

Every task ahead of the one picked has been overtaken once more: its ``deferrals`` is
incremented. Invariant: no task is overtaken more than ``max_deferrals`` times, because a
task at the cap is picked before anything behind it, and everything ahead of it is below the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenomy.policy.estimator import Estimator


@dataclass(frozen=True, slots=True)
class ReorderConfig:
    """``window``: tasks at the queue head that may be reordered (5: whitepaper-specified).
    ``max_deferrals``: how often one task may be overtaken (our choice, 3: bounds the extra
    wait of a long task to three short prefills while leaving room to rescue tight deadlines).
    """

    window: int = 5
    max_deferrals: int = 3

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.max_deferrals < 0:
            raise ValueError(f"max_deferrals must be >= 0, got {self.max_deferrals}")


@dataclass(slots=True)
class PrefillTask:
    """One queued prefill: ``deadline_s`` is when its first token is due (arrival + TTFT SLO)."""

    request_id: str
    arrival_s: float
    deadline_s: float
    new_tokens: int
    cached_tokens: int
    deferrals: int = 0


class LookaheadReorder:
    """Picks the next prefill from the head of a queue (module docstring)."""

    def __init__(self, config: ReorderConfig, estimator: Estimator) -> None:
        self.config = config
        self.estimator = estimator

    def pick(self, queue: list[PrefillTask], now: float) -> int:
        """Index in ``queue`` (always ``< window``) of the task to run next.

        Increments ``deferrals`` of the tasks ahead of it; does not remove it (the caller pops).
        Raises ValueError on an empty queue.
        """
        if not queue:
            raise ValueError("cannot pick from an empty prefill queue")
        window = queue[: self.config.window]
        capped = [i for i, t in enumerate(window) if t.deferrals >= self.config.max_deferrals]
        chosen = capped[0] if capped else self._most_deadlines_met(window, now)
        for task in queue[:chosen]:
            task.deferrals += 1
        return chosen

    def _most_deadlines_met(self, window: list[PrefillTask], now: float) -> int:
        service = [self.estimator.prefill_time_s(t.new_tokens, t.cached_tokens) for t in window]
        taken: list[int] = []
        finish = now
        for i in sorted(range(len(window)), key=lambda j: (window[j].deadline_s, j)):
            taken.append(i)
            finish += service[i]
            if finish > window[i].deadline_s:
                longest = max(taken, key=lambda j: (service[j], j))
                taken.remove(longest)
                finish -= service[longest]
        return taken[0] if taken else 0
