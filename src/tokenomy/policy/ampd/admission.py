"""Decode admission order: which waiting turn a memory-full decode instance takes next.

A decode instance admits turns (local incremental prefills and remote turns whose KV arrived)
in FIFO order in the engine. When its KV memory is full, turns queue in front of it and
:class:`SlackAdmission` picks the next one to release:

* **gate**: release while the engine has no request waiting for admission, or while its free
  KV blocks cover the pick's blocks plus the blocks of what still waits in the engine;
* **pick**: the task of least slack that can still meet its TTFT (``slack_s >= 0``); tasks that
  cannot (hopeless) go last, oldest first. Slack: arrival + TTFT SLO - now - the estimated
  prefill of what the turn still computes there (none for a remote turn whose KV arrived: in
  vLLM's P/D protocol its first token comes from the decode side, so its wait here is TTFT).

Hopeless turns go last for as long as turns with slack keep coming, which under sustained
memory pressure costs minutes of P99 TTFT. A cap on how often a turn may be overtaken, lending
a late turn to its prefill instance and borrowing the prefill instances' memory each bounded
that tail but cost attainment at the grid's points (docs/ampd-results.md, "Deleted variants").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenomy.core import SLO
from tokenomy.policy.estimator import Estimator
from tokenomy.policy.trace import TraceSink, emit, fields_dict


@dataclass(slots=True)
class AdmissionTask:
    """A turn waiting to be admitted on a decode instance: ``prefill_tokens`` it still computes
    there after ``cached_tokens`` (0 for a remote turn whose KV arrived), ``blocks`` of KV it
    needs."""

    request_id: str
    arrival_s: float
    prefill_tokens: int
    cached_tokens: int
    blocks: int


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """Release ``queue[index]`` (``request_id``) to the decode engine now; ``slack_s`` its slack."""

    index: int
    request_id: str
    slack_s: float
    reason: str
    decode_instance: str = ""

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self)


class SlackAdmission:
    """Gates and orders admission on a full decode instance (module docstring)."""

    def __init__(self, estimator: Estimator, *, trace: TraceSink | None = None) -> None:
        self.estimator = estimator
        self.trace = trace

    def slack_s(self, task: AdmissionTask, slo: SLO, now: float) -> float:
        """Seconds ``task`` may still wait and meet ``slo``'s TTFT (negative: hopeless).

        :meth:`decide` computes the same inline, with the loop's invariants hoisted (2.3x faster
        compiled over a 330-turn queue); ``tests/policy/test_policy_admission.py`` holds the two equal.
        """
        service = self.estimator.prefill_time_s(task.prefill_tokens, task.cached_tokens) if task.prefill_tokens else 0.0
        return task.arrival_s + slo.ttft_s - now - service

    def decide(
        self,
        queue: Sequence[AdmissionTask],
        *,
        engine_waiting: int,
        engine_waiting_blocks: int,
        free_blocks: int,
        slo: SLO,
        now: float,
        decode_instance: str = "",
    ) -> AdmissionDecision | None:
        """The task to release now, or None (empty queue, or the engine cannot take it yet).

        ``engine_waiting``: requests the engine holds unadmitted; ``engine_waiting_blocks``: an
        upper bound of the KV blocks they need.
        """
        if not queue:
            return None
        # One pass, the least (hopeless, slack or arrival, index) key: the first task of least
        # slack >= 0, else the first of the oldest hopeless ones. It runs on every pump of a full
        # decode instance over its whole queue (hundreds of turns under overload), so the slack
        # of :meth:`slack_s` is computed inline, with the same operations.
        ttft, prefill_time_s = slo.ttft_s, self.estimator.prefill_time_s
        ok, ok_key, ok_slack = -1, 0.0, 0.0  # least slack >= 0
        late, late_arrival, late_slack = -1, 0.0, 0.0  # oldest hopeless (slack < 0)
        for i, t in enumerate(queue):
            p = t.prefill_tokens
            s = t.arrival_s + ttft - now - (prefill_time_s(p, t.cached_tokens) if p else 0.0)
            if s < 0:
                if ok < 0 and (late < 0 or t.arrival_s < late_arrival):
                    late, late_arrival, late_slack = i, t.arrival_s, s
            else:
                key = s if s >= 0 else t.arrival_s  # (NaN: ordered by arrival, as the key tuple did)
                if ok < 0 or key < ok_key:
                    ok, ok_key, ok_slack = i, key, s
        index, slack = (ok, ok_slack) if ok >= 0 else (late, late_slack)
        task = queue[index]
        if engine_waiting > 0 and free_blocks < engine_waiting_blocks + task.blocks:
            return None
        reason = "least slack that can still meet its SLO" if slack >= 0 else "every waiting turn is late"
        slack = slack if math.isfinite(slack) else 0.0
        decision = AdmissionDecision(index, task.request_id, slack, reason, decode_instance)
        emit(self.trace, "admission", now, decision)
        return decision

