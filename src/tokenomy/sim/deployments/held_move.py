"""A local turn that would wait for memory on its decode instance moves to one with room
(``AMPDOptions.move_held_turns``, on in ``ampd``).

Two parts. **Blocks as the engine counts them**: a local turn's admission task counts the history
it reloads from host memory as blocks it needs (the engine allocates GPU blocks for a reloaded
prefix as for a computed one), where without the move it counts as cached. **Moving a turn that would
wait**: when a local turn reaches its decode instance's admission queue and the instance's free
blocks do not cover it (with the turns queued or waiting in the engine ahead of it), so that it
would wait for memory there (the session's history cached in free blocks is not counted free:
reusing it takes it off the free pool, as the engine's admission counts), the session moves to the decode instance with room for its whole context (the
binder's first-binding headroom) and nothing queued or waiting, fewest running first, and its
history follows over the KV link (``KVKeeper.move_history``); the turn then runs locally there,
once its history is in that instance's host tier. The move is traced as a
``binding`` decision (``rebound``, ``move_history``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenomy.policy.ampd import AdmissionTask, SessionBinder
from tokenomy.policy.ampd.binding import BindingDecision, blocks_needed
from tokenomy.policy.trace import emit
from tokenomy.sim.deployments.ampd_turn import Turn
from tokenomy.sim.deployments.decode_queue import DecodeAdmissionQueue
from tokenomy.sim.deployments.kv_keeper import KVKeeper
from tokenomy.sim.instance import SimInstance


class HeldTurnMover:
    """Moves local turns that would wait for memory to a decode instance with room (module docstring)."""

    def __init__(self, binder: SessionBinder, keeper: KVKeeper, decodes: Sequence[SimInstance],
                 queues: dict[str, DecodeAdmissionQueue], run_local: Callable[[Turn, float], None]) -> None:
        self._binder = binder
        self._keeper = keeper
        self._decodes = list(decodes)
        self._queues = queues
        self._run_local = run_local
        self.moved = 0

    def try_move(self, turn: Turn, task: AdmissionTask, queue: DecodeAdmissionQueue, now: float) -> bool:
        """Before ``task`` (``turn``'s) joins ``queue``: if its decode instance lacks the blocks for
        it now, move it to another decode instance with room; True if moved (not to be queued)."""
        req = turn.request
        engine = queue.instance.engine
        # The session's history cached in the free pool is counted free, but admitting it takes it off the pool.
        if engine.free_blocks - engine.cached_prefix_free_blocks(req.content, req.prompt_tokens) \
                >= task.blocks + queue.pending_blocks():
            return False
        headroom = self._binder.config.kv_headroom_fraction
        room = [d for d in self._decodes
                if d.instance_id != turn.decode_id and d.engine.num_waiting == 0
                and not len(self._queues[d.instance_id])
                and d.engine.free_blocks - blocks_needed(req, d.engine) >= headroom * d.engine.total_blocks]
        if not room:
            return False
        new = min(room, key=lambda d: (d.engine.num_running, -d.engine.free_blocks, d.instance_id))
        old = queue.instance
        self._keeper.move_history(req, old, new, now)
        if req.session_id:
            self._binder.adopt(req.session_id, new.instance_id)
        emit(self._binder.trace, "binding", now, BindingDecision(
            req.session_id, new.instance_id, rebound=True, from_instance=old.instance_id,
            reason="turn would wait for memory on its instance: moved to one with room", move_history=True))
        turn.decode_id = new.instance_id
        self.moved += 1
        self._run_local(turn, now)
        return True
