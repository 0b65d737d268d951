"""A later turn leaves its bound decode instance when it would queue there behind prefill work and
another decode instance would start it sooner, history move included
(``AMPDOptions.move_queued_turns``, on in ``ampd``; the rule is
:func:`tokenomy.policy.ampd.turn_move.choose_turn_move`).

Estimates: a queue is its instance's queued prompt tokens drained in full prefill steps of
``max_num_batched_tokens`` (the decode-side model's prefill time); a move is the history's
transfer over the KV link and its PCIe reload on the target (``KVKeeper.move_estimate_s``). A
move sends the history (``KVKeeper.move_history``), re-binds the session and is traced as a
``binding`` decision (``rebound``, ``move_history``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenomy.core import Request
from tokenomy.policy.ampd import SessionBinder
from tokenomy.policy.ampd.binding import BindingDecision
from tokenomy.policy.ampd.turn_move import TurnMoveConfig, choose_turn_move
from tokenomy.policy.estimator import Estimator
from tokenomy.policy.trace import emit
from tokenomy.policy.view import InstanceView
from tokenomy.sim.deployments.decode_queue import DecodeAdmissionQueue
from tokenomy.sim.deployments.kv_keeper import KVKeeper
from tokenomy.sim.instance import SimInstance


class QueuedTurnMover:
    """Moves a later turn off a bound decode instance where it would queue (module docstring)."""

    def __init__(self, binder: SessionBinder, keeper: KVKeeper, decodes: Sequence[SimInstance],
                 queues: dict[str, DecodeAdmissionQueue], estimator: Estimator, budget_tokens: int,
                 config: TurnMoveConfig | None = None) -> None:
        self._binder = binder
        self._keeper = keeper
        self._decodes = list(decodes)
        self._by_id = {d.instance_id: d for d in decodes}
        self._queues = queues
        self._config = config or TurnMoveConfig(headroom_fraction=binder.config.kv_headroom_fraction)
        self._budget = budget_tokens
        self._step_s = estimator.prefill_time_s(budget_tokens, 0)  # one full prefill step
        self.moved = 0

    def _queue_s(self, view: InstanceView) -> float:
        return view.num_waiting_tokens / self._budget * self._step_s

    def place(self, request: Request, decode: SimInstance, now: float) -> SimInstance:
        """The decode instance ``request``'s turn runs on: ``decode`` (its binding), or the one it
        moved to with its history."""
        if request.history_tokens <= 0 or not request.session_id:
            return decode
        others = [d.engine for d in self._decodes
                  if d is not decode and not len(self._queues.get(d.instance_id, ()))]
        move = choose_turn_move(
            request, decode.engine, others, queue_s=self._queue_s,
            move_s=lambda v: self._keeper.move_estimate_s(request, decode, self._by_id[v.instance_id], now),
            margin_s=self._config.margin_steps * self._step_s, config=self._config,
        )
        if move.to_instance is None:
            return decode
        new = self._by_id[move.to_instance]
        self._keeper.move_history(request, decode, new, now)
        self._binder.adopt(request.session_id, new.instance_id)
        emit(self._binder.trace, "binding", now, BindingDecision(
            request.session_id, new.instance_id, rebound=True, from_instance=decode.instance_id,
            reason=f"{move.reason} ({move.go_s:.2f} s against {move.stay_s:.2f} s)", move_history=True))
        self.moved += 1
        return new
