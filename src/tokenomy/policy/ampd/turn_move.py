"""AMPD per-turn placement across decode instances: a later turn leaves a bound instance where it
would queue behind prefill work (``AMPDOptions.move_queued_turns``, on in the simulator's ``ampd``).

Session binding keeps a session on its decode instance while the instance has memory for it
(:class:`~tokenomy.policy.ampd.SessionBinder`); it does not look at what the instance is computing.
On GAIA at 8 x H100 with no prefill instance (the AMPD grid's point (a), docs/ampd-results.md) 9 of the 32
turns slower than colocated-offload's P99 TTFT waited 0.2-1.8 s behind another session's prefill
on their bound instance while other instances had no prompt token queued.

Rule, for a turn of a session whose history its bound instance holds:

* ``stay_s``: when the turn's prefill could start on the bound instance: the instance's queued
  prompt tokens (``num_waiting_tokens``) drained in full prefill steps (the caller's estimate);
* for every other instance with room for the whole context and the output (``blocks_needed``
  there, plus ``headroom_fraction`` of its blocks: the binder's first-binding headroom) and no
  request waiting: ``go_s``, when the history would be there (sent over the KV link, then
  reloaded from that instance's host tier over PCIe; the caller's estimate), or when its own
  queued prompt tokens drain, whichever is later;
* the turn moves to the instance of least ``go_s`` (then fewest running, most free blocks, id)
  when ``go_s + margin_s < stay_s``. ``margin_s`` is one full prefill step
  (``TurnMoveConfig.margin_steps``, a labelled default: a queue drains in whole steps, so the
  two estimates are each good to about one step; a smaller gain is within their error).

The move itself (the history sent, the binding adopted) is the caller's; the decision says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenomy.core import Request
from tokenomy.policy.ampd.binding import blocks_needed
from tokenomy.policy.view import InstanceView


@dataclass(frozen=True, slots=True)
class TurnMoveConfig:
    """``margin_steps``: the estimated gain a move needs, in full prefill steps (module docstring;
    1.0 is our labelled default). ``headroom_fraction``: blocks the target keeps free after the
    turn's whole context and output (the binder's first-binding headroom, 0.1)."""

    margin_steps: float = 1.0
    headroom_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not self.margin_steps >= 0:
            raise ValueError(f"margin_steps must be >= 0, got {self.margin_steps}")
        if not 0.0 <= self.headroom_fraction < 1.0:
            raise ValueError(f"headroom_fraction must be in [0, 1), got {self.headroom_fraction}")


@dataclass(frozen=True, slots=True)
class TurnMove:
    """Where a turn's prefill could start: ``stay_s`` on the bound instance, ``go_s`` on
    ``to_instance`` (None: stays; ``go_s`` is then the best other's, inf when none qualified)."""

    request_id: str
    from_instance: str
    to_instance: str | None
    stay_s: float
    go_s: float
    reason: str


def choose_turn_move(
    request: Request,
    bound: InstanceView,
    others: Sequence[InstanceView],
    *,
    queue_s: Callable[[InstanceView], float],
    move_s: Callable[[InstanceView], float],
    margin_s: float,
    config: TurnMoveConfig,
) -> TurnMove:
    """Whether ``request`` leaves ``bound`` for one of ``others`` (module docstring).

    ``queue_s(view)``: seconds until the view's queued prompt tokens are computed; ``move_s(view)``:
    seconds until the session's history would be usable on that view; ``margin_s``: the gain a
    move needs.
    """
    rid, home = request.request_id, bound.instance_id
    stay = queue_s(bound)
    if stay <= margin_s:
        return TurnMove(rid, home, None, stay, math.inf, "bound instance's queue is within the margin")
    best: tuple[float, int, int, str] | None = None
    for view in others:
        if view.instance_id == home or view.num_waiting > 0:
            continue
        left = view.free_blocks - blocks_needed(request, view)
        if left < config.headroom_fraction * view.total_blocks:
            continue
        go = max(move_s(view), queue_s(view))
        key = (go, view.num_running, -left, view.instance_id)
        if best is None or key < best:
            best = key
    if best is None:
        return TurnMove(rid, home, None, stay, math.inf, "no other instance has room and nothing waiting")
    go, target = best[0], best[3]
    if go + margin_s < stay:
        return TurnMove(rid, home, target, stay, go, "bound instance is queued; another starts it sooner")
    return TurnMove(rid, home, None, stay, go, "moving is not sooner by the margin")
