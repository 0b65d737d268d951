"""Decode admission order: which waiting turn a memory-full decode instance takes next.

A decode instance admits turns (local incremental prefills and remote turns whose KV arrived)
in FIFO order in the engine. When its KV memory is full, turns queue in front of it and
:class:`SlackAdmission` picks the next one to release:

* **gate**: release while the engine has no request waiting for admission, or while its free
  KV blocks cover the pick's blocks plus the blocks of what still waits in the engine;
* **starvation cap** (optional, off by default): the first task already overtaken
  ``max_overtakes`` times goes next. Hopeless turns go last for as long as turns with slack
  keep coming (minutes of P99 TTFT under sustained memory pressure); a cap of 3 (the prefill
  reordering's ``max_deferrals``) halved AMPD's P99 TTFT at point (c) of the grid but cost
  3-14 points of attainment there (docs/ampd-results.md, sixth round), so it is not the default;
* **pick**: the task of least slack that can still meet its TTFT (``slack_s >= 0``); tasks that
  cannot (hopeless) go last, oldest first. Slack: arrival + TTFT SLO - now - the estimated
  prefill of what the turn still computes there (none for a remote turn whose KV arrived: in
  vLLM's P/D protocol its first token comes from the decode side, so its wait here is TTFT);
* **lend** (``lend_late``, off by default: tried in the seventh round, it cost attainment): a remote turn still held when its slack runs out
  (its TTFT deadline passes on a memory-full decode instance) is decoded by the prefill
  instance that computed its prompt, if that instance has the KV blocks free
  (:meth:`SlackAdmission.lend`). Slack order serves such a turn last, so under sustained memory
  pressure it waited minutes (docs/ampd-results.md, seventh round: 27 of the 28 slowest turns at
  point (c), 0.06/s, waited 20-107 s here after a prefill of under 2 s); a prefill instance holds
  KV only while it prefills, so it has the memory the decode pool lacks, and its prefix cache
  still holds the prompt. The turn is already late: it is the tail that this bounds, at the
  cost of its TPOT (it decodes beside prefill chunks) and of some of the prefill node's cache.
* **borrow** (``borrow``, off by default; eighth round): the decode pool borrows the prefill
  instances' KV memory. A remote turn whose KV arrived at a decode instance that cannot admit
  it now starts decoding at once on the prefill instance that computed it
  (:meth:`SlackAdmission.borrow`: only with blocks the lender's queued prompts do not need, and
  while what it has lent stays within ``max_lent_fraction`` of its KV), and waits in its decode
  instance's queue as a *returning* task; returning tasks are released first (their stream
  runs at the prefill node's step pace and they hold its memory), and the turn's KV (prompt
  and the tokens decoded so far) moves back over the KV link. Unlike ``lend`` the turn does
  not wait for its deadline (at TTFT SLO 10 s a turn lent at the deadline is already slower
  than colocated-offload's P99) and does not stay on the lender to its end. With borrowing on,
  the gate releases a turn only into room (free blocks for it and what the engine holds
  unadmitted), never into a wait inside the engine, and a local turn held here is better
  served by the prefill pool (:meth:`SlackAdmission.reroute`): it is prefilled remotely and,
  if its decode instance is still full then, borrowed. While a prefill instance decodes
  borrowed turns its prefill chunks are capped so that a step fits the TPOT SLO
  (:func:`lender_chunk_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenomy.core import SLO, StepShape
from tokenomy.policy.estimator import Estimator
from tokenomy.policy.trace import TraceSink, emit, fields_dict


@dataclass(slots=True)
class AdmissionTask:
    """A turn waiting to be admitted on a decode instance: ``prefill_tokens`` it still computes
    there after ``cached_tokens`` (0 for a remote turn whose KV arrived), ``blocks`` of KV it
    needs; ``overtaken``: how often a later task was released before it."""

    request_id: str
    arrival_s: float
    prefill_tokens: int
    cached_tokens: int
    blocks: int
    overtaken: int = 0
    returning: bool = False  # decoding on a lender, waiting to move back here (``borrow``)


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

    def __init__(self, estimator: Estimator, *, trace: TraceSink | None = None, max_overtakes: int | None = None,
                 lend_late: bool = False, borrow: bool = False, max_lent_fraction: float = 0.5) -> None:
        if max_overtakes is not None and max_overtakes < 0:
            raise ValueError(f"max_overtakes must be >= 0 or None, got {max_overtakes}")
        self.estimator = estimator
        self.trace = trace
        self.max_overtakes = max_overtakes  # None: no cap
        self.lend_late = lend_late
        if not 0.0 < max_lent_fraction <= 1.0:
            raise ValueError(f"max_lent_fraction must be in (0, 1], got {max_lent_fraction}")
        self.borrow_memory = borrow
        # A labelled default (our choice, no evidence): a prefill instance lends at most half its KV.
        self.max_lent_fraction = max_lent_fraction

    def borrow(self, task: AdmissionTask, *, lender_free_blocks: int, lender_blocks: int, lender_total_blocks: int,
               lender_lent_blocks: int, now: float, lender_backlog_blocks: int = 0, lender: str = "",
               decode_instance: str = "") -> AdmissionDecision | None:
        """Whether held ``task`` (a remote turn whose KV arrived; its decode instance cannot take
        it now) starts decoding on ``lender``, the prefill instance that computed it (module
        docstring, **borrow**): the lender's free blocks must cover ``lender_blocks`` (the turn's)
        plus ``lender_backlog_blocks`` (its queued prompts'), and ``lender_lent_blocks`` (lent
        already) plus the turn's may not pass ``max_lent_fraction`` of ``lender_total_blocks``.
        The decision's ``index`` is -1 (the caller takes the task out of its queue by id)."""
        if not self.borrow_memory or task.prefill_tokens > 0 or task.returning:
            return None
        if lender_free_blocks < lender_blocks + lender_backlog_blocks:
            return None
        if lender_lent_blocks + lender_blocks > self.max_lent_fraction * lender_total_blocks:
            return None
        decision = AdmissionDecision(-1, task.request_id, 0.0, f"decode instance full: decodes on {lender} until it has room",
                                     decode_instance)
        emit(self.trace, "admission_borrow", now, decision)
        return decision

    def lend(self, task: AdmissionTask, *, lender_free_blocks: int, lender_blocks: int, slo: SLO, now: float,
             lender_backlog_blocks: int = 0, lender: str = "", decode_instance: str = "") -> AdmissionDecision | None:
        """Whether held ``task`` (a remote turn whose KV arrived) should be decoded by ``lender``,
        the prefill instance that computed it, instead (module docstring): only once its slack
        is spent, and only with memory the lender's own prefill work does not need: its free
        blocks must cover ``lender_blocks`` (the turn's) plus ``lender_backlog_blocks`` (the
        prompts waiting for it). The decision's ``index`` is -1 (the caller takes the task out
        of its queue by id)."""
        if not self.lend_late or task.prefill_tokens > 0:
            return None
        slack = self.slack_s(task, slo, now)
        if slack > 0 or lender_free_blocks < lender_blocks + lender_backlog_blocks:
            return None
        decision = AdmissionDecision(-1, task.request_id, slack, f"TTFT deadline passed here: decoded on {lender}",
                                     decode_instance)
        emit(self.trace, "admission_lend", now, decision)
        return decision

    def reroute(self, task: AdmissionTask, *, slo: SLO, now: float, prefill_instance: str,
                decode_instance: str = "") -> AdmissionDecision | None:
        """Whether held ``task``, a local turn (a prefill still to compute here), goes to
        ``prefill_instance`` instead (module docstring, **borrow**); index -1, as :meth:`borrow`."""
        if not self.borrow_memory or task.prefill_tokens <= 0 or not prefill_instance:
            return None
        decision = AdmissionDecision(-1, task.request_id, self.slack_s(task, slo, now),
                                     f"decode instance full: prefilled on {prefill_instance}", decode_instance)
        emit(self.trace, "admission_reroute", now, decision)
        return decision

    def slack_s(self, task: AdmissionTask, slo: SLO, now: float) -> float:
        """Seconds ``task`` may still wait and meet ``slo``'s TTFT (negative: hopeless)."""
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
        slacks = [self.slack_s(t, slo, now) for t in queue]
        cap = self.max_overtakes
        capped = [i for i, t in enumerate(queue) if cap is not None and t.overtaken >= cap]
        returning = [i for i, t in enumerate(queue) if t.returning]
        if returning:  # a borrowed turn moves back first (module docstring, **borrow**)
            index = min(returning, key=lambda i: (queue[i].arrival_s, i))
        elif capped:
            index = capped[0]
        else:
            index = min(range(len(queue)),
                        key=lambda i: (slacks[i] < 0, slacks[i] if slacks[i] >= 0 else queue[i].arrival_s, i))
        task = queue[index]
        # With borrowing, a turn is released only into room (a returning one streams on its lender
        # meanwhile; another one is better served by the prefill pool than by a wait in the engine).
        if (engine_waiting > 0 or self.borrow_memory or task.returning) \
                and free_blocks < engine_waiting_blocks + task.blocks:
            return None
        for ahead in queue[:index]:  # released before them: each is overtaken once more
            ahead.overtaken += 1
        if returning:
            reason = "a borrowed turn moves back"
        elif capped:
            reason = f"overtaken {task.overtaken} times"
        else:
            reason = "least slack that can still meet its SLO" if slacks[index] >= 0 else "every waiting turn is late"
        slack = slacks[index] if math.isfinite(slacks[index]) else 0.0
        decision = AdmissionDecision(index, task.request_id, slack, reason, decode_instance)
        emit(self.trace, "admission", now, decision)
        return decision


def lender_chunk_tokens(estimator: Estimator, slo: SLO, *, decode_seqs: int, decode_context_tokens: int,
                        prefill_context_tokens: int, budget_tokens: int, min_tokens: int = 16) -> int:
    """The prompt tokens per step a prefill instance decoding ``decode_seqs`` borrowed turns may
    compute: the largest of ``budget_tokens``, its half, its quarter, ... (down to ``min_tokens``)
    whose step, carrying those decodes and a chunk at ``prefill_context_tokens`` of context, fits
    the TPOT SLO (0: no borrowed turn, no cap). As placement sizes a decode node's local chunks,
    so a lender keeps the streams it borrowed within their SLO."""
    if decode_seqs <= 0:
        return 0
    chunk = budget_tokens
    while chunk > min_tokens:
        step = estimator.step_time_s(StepShape(
            prefill_tokens=chunk, prefill_seqs=1,
            prefill_attn_pairs=StepShape.chunk_attn_pairs(chunk, prefill_context_tokens),
            prefill_context_tokens=prefill_context_tokens + chunk,
            decode_seqs=decode_seqs, decode_context_tokens=decode_context_tokens,
        ))
        if step <= slo.tpot_s:
            break
        chunk = max(min_tokens, chunk // 2)
    return chunk
