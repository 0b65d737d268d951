"""The decode pool borrows prefill instances' KV memory, with move-back (eighth round).

A remote turn whose KV reached a decode instance that cannot admit it now (its admission queue
holds it) starts decoding at once on the prefill instance that computed it, if
:meth:`~tokenomy.policy.ampd.SlackAdmission.borrow` says the lender can spare the blocks. A
*returning* task takes its place in the decode instance's admission queue; when the policy
releases it (returning tasks go first, and only into room), the lender stops the turn, its KV
(prompt and the tokens decoded so far) crosses the contended KV link, and the decode instance
continues the stream. The record joins both parts: the first token and the lender's tokens,
then the decode instance's; the pause of the move is one inter-token gap.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

from tokenomy.engine import FinishedRequest
from tokenomy.policy.ampd import AdmissionTask, SlackAdmission
from tokenomy.policy.ampd.admission import lender_chunk_tokens
from tokenomy.policy.estimator import Estimator
from tokenomy.sim.base import SimContext
from tokenomy.sim.deployments.ampd_turn import Turn as _Turn
from tokenomy.sim.deployments.decode_queue import DecodeAdmissionQueue
from tokenomy.sim.instance import SimInstance
from tokenomy.sim.link import KVFabric


class MemoryBorrow:
    """Lends held remote turns to their prefill instances and moves them back (module docstring).

    ``instances``: every instance by id; ``queues``: the decode instances' admission queues by
    id; ``backlog_tokens``: a prefill instance's queued prompt tokens by id; ``on_cut``: a
    move-back transfer timed out (the turn is incomplete)."""

    def __init__(self, ctx: SimContext, policy: SlackAdmission, instances: dict[str, SimInstance],
                 queues: dict[str, DecodeAdmissionQueue], fabric: KVFabric, kv_bytes_per_token: float,
                 backlog_tokens: Callable[[str], int], on_cut: Callable[[_Turn], None],
                 lender_estimator: Estimator) -> None:
        self.ctx = ctx
        self._lender_estimator = lender_estimator
        self._lent: dict[str, dict[str, int]] = defaultdict(dict)  # by lender: request id -> its prompt tokens
        self.policy = policy
        self._by_id = instances
        self._queues = queues
        self._fabric = fabric
        self._kv_bytes = kv_bytes_per_token
        self._backlog = backlog_tokens
        self._on_cut = on_cut
        self.lent_blocks: dict[str, int] = defaultdict(int)  # by lender: blocks of the turns it decodes
        self.borrowed = 0  # turns lent
        self.moved_back = 0  # of them, moved back to their decode instance

    def try_lend(self, turn: _Turn, queue: DecodeAdmissionQueue, now: float) -> bool:
        """``turn`` is held in ``queue`` (its decode instance's): lend it if the policy agrees."""
        req = turn.request
        task = queue.held(req.request_id)
        if task is None or not turn.prefill_id:
            return False
        lender = self._by_id[turn.prefill_id]
        engine = lender.engine
        bs = engine.block_size_tokens
        cached = engine.cached_prefix_tokens(req.content, req.prompt_tokens)
        need = -(-(req.prompt_tokens - cached + req.max_output_tokens) // bs)
        decision = self.policy.borrow(
            task, lender_free_blocks=engine.free_blocks, lender_blocks=need, lender_total_blocks=engine.total_blocks,
            lender_lent_blocks=self.lent_blocks[lender.instance_id], now=now,
            lender_backlog_blocks=-(-self._backlog(lender.instance_id) // bs), lender=lender.instance_id,
            decode_instance=turn.decode_id,
        )
        if decision is None:
            return False
        queue.take(req.request_id)
        turn.lender, turn.lent_blocks = lender.instance_id, need
        self.lent_blocks[lender.instance_id] += need
        self._lent[lender.instance_id][req.request_id] = req.prompt_tokens
        self.borrowed += 1
        # Its prompt's KV is in the lender's prefix cache (what LRU evicted is recomputed there).
        lender.submit(req, now, emitted_tokens=1, continuation=True)
        self._cap(lender)
        back = AdmissionTask(req.request_id, req.arrival_s, 0, req.prompt_tokens, task.blocks, returning=True)
        queue.push(back, lambda at: self._move_back(turn, at), now)
        return True

    def finished_on_lender(self, turn: _Turn) -> None:
        """``turn`` ended on its lender before it could move back."""
        self._queues[turn.decode_id].take(turn.request.request_id)
        self._release(turn)

    def _release(self, turn: _Turn) -> None:
        self.lent_blocks[turn.lender] -= turn.lent_blocks
        self._lent[turn.lender].pop(turn.request.request_id, None)
        self._cap(self._by_id[turn.lender])

    def _cap(self, lender: SimInstance) -> None:
        """Size the lender's prefill chunks so that its borrowed streams keep their TPOT."""
        lent = self._lent[lender.instance_id]
        lender.engine.set_prefill_chunk_cap(lender_chunk_tokens(
            self._lender_estimator, self.ctx.slo, decode_seqs=len(lent), decode_context_tokens=sum(lent.values()),
            prefill_context_tokens=max(lent.values(), default=0),
            budget_tokens=lender.engine.config.max_num_batched_tokens,
        ))

    def _move_back(self, turn: _Turn, now: float) -> None:
        req = turn.request
        lender = self._by_id[turn.lender]
        part = lender.abort(req.request_id, now)
        if part is None:  # it finished there; its result is on the way (finished_on_lender)
            return
        self._release(turn)
        turn.lender, turn.lent_part = "", part
        self.moved_back += 1
        decode = self._by_id[turn.decode_id]
        emitted = 1 + part.output_tokens
        tokens = req.prompt_tokens + emitted

        def arrive() -> None:
            decode.submit(req, self.ctx.loop.now, preloaded_tokens=req.prompt_tokens, emitted_tokens=emitted,
                          continuation=True)

        self._fabric.send(lender.instance_id, decode.instance_id, tokens * self._kv_bytes, now, arrive,
                          kind="move_back", on_timeout=lambda: self._on_cut(turn))


def joined(part: FinishedRequest | None, dec: FinishedRequest) -> FinishedRequest:
    """The decode side of a turn that began on a lender (``part``) and ended on ``dec``'s instance."""
    if part is None:
        return dec
    first = part.first_token_s if part.first_token_s is not None else dec.first_token_s
    gap = dec.first_token_s - part.finish_s if dec.first_token_s is not None else 0.0
    return replace(dec, first_token_s=first, output_tokens=part.output_tokens + dec.output_tokens,
                   max_itl_s=max(part.max_itl_s, dec.max_itl_s, gap),
                   num_preemptions=part.num_preemptions + dec.num_preemptions)

