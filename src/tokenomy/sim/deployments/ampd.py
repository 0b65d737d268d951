"""AMPD: multi-turn agent scheduling over PD disaggregation (MISSION.md, layer 3).

Decode instances are bound to sessions and keep their history KV; each turn's prefill runs
either on a prefill instance (remote: ship the history the prefill node lacks, prefill the
new tokens, ship only the new KV back) or on the bound decode instance itself (local), by the
slack rule of :class:`~tokenomy.policy.ampd.AdaptivePlacement`. Prefill queues are reordered
within a look-ahead window, turns waiting for a memory-full decode instance are admitted in
slack order (:class:`~tokenomy.policy.ampd.SlackAdmission`), and KV is kept, offloaded or
dropped across tool calls. Local prefills may spend the streams' banked TPOT slack
(``banked_chunks.py``), and a turn that would wait for memory or queue behind prefill work on
its instance moves to another (``held_move.py``, ``turn_move.py``). Every mechanism is a policy
object from :mod:`tokenomy.policy.ampd` and can be switched off in
:class:`~tokenomy.sim.config.AMPDOptions` for ablation.

Why one file: it is one turn's path through the deployment, in the order a turn takes it
(arrival, binding, a move, placement; then the local path or the remote one with its two KV
transfers; admission on the decode instance; completion). Each step's state and rules live in
the collaborator it calls (the KV keeper, the admission and prefill queues, the movers, the
banked chunks); what is left here is the order of the steps and the hand-offs between them,
which a reader follows top to bottom, and which a split by line count would scatter.
"""

from __future__ import annotations

from tokenomy.core import Request, Role
from tokenomy.engine import FinishedRequest, StepResult
from tokenomy.policy.ampd import AdmissionTask, PlacementDecision, PrefillTask
from tokenomy.policy.ampd.output_lengths import OutputLengths
from tokenomy.policy.router import make_router
from tokenomy.sim.base import (
    Deployment,
    SimContext,
    register_deployment,
    single_record,
    split_record,
)
from tokenomy.sim.deployments.ampd_turn import Turn as _Turn
from tokenomy.sim.deployments.ampd_turn import unfinished_record
from tokenomy.sim.deployments.banked_chunks import BankedPrefills
from tokenomy.sim.deployments.decode_queue import DecodeAdmissionQueue
from tokenomy.sim.deployments.disagg import kv_fabric
from tokenomy.sim.deployments.held_move import HeldTurnMover
from tokenomy.sim.deployments.kv_keeper import KVKeeper
from tokenomy.sim.deployments.policies import sim_policies
from tokenomy.sim.deployments.prefill_queue import PrefillQueue
from tokenomy.sim.deployments.turn_move import QueuedTurnMover
from tokenomy.sim.instance import SimInstance


@register_deployment
class AMPD(Deployment):
    name = "ampd"

    def __init__(self, ctx: SimContext) -> None:
        super().__init__(ctx)
        cfg, opts = ctx.config, ctx.config.ampd
        self.prefills = [self._make_instance(f"prefill-{i}", Role.PREFILL) for i in range(cfg.prefill)]
        # Decode instances run local prefills in the small chunks the placement policy prices,
        # so that a local prefill inflates each decode step by a bounded amount.
        local_budget = opts.placement_config.local_budget_tokens + cfg.decode_max_num_seqs
        banked = opts.placement and opts.placement_config.tpot_bank  # or in chunks the TPOT bank allows
        if banked:
            local_budget = max(local_budget, cfg.max_num_batched_tokens + cfg.decode_max_num_seqs)
        self.decodes = self._make_decodes(local_budget)
        self._by_id = {inst.instance_id: inst for inst in self.instances}
        self._decode_views, self._prefill_views = [d.engine for d in self.decodes], [p.engine for p in self.prefills]
        # Every decision below comes from these policy objects, built as a live path builds them.
        self.policies = sim_policies(ctx)
        self._binder = self.policies.binder
        self._placement = self.policies.placement
        # Decode instances of the prefill role's shape price their own work with their own model.
        alt = (sim_policies(ctx, decode_perf=ctx.role_perf.get(Role.PREFILL, ctx.perf)) if cfg.prefill_type_decodes
               else None)
        self._alt_ids = {d.instance_id for d in self.decodes[:cfg.prefill_type_decodes]}
        self._alt_placement = alt.placement if alt is not None else None
        self._decode_router = make_router(cfg.decode_router)
        self._router = make_router(cfg.router)
        self._queues = {p.instance_id: PrefillQueue(p, self.policies.dispatch) for p in self.prefills}
        self.fabric = kv_fabric(ctx, self.instances)
        admission = self.policies.admission
        self._admit: dict[str, DecodeAdmissionQueue] = {}
        if admission is not None:
            alt_admission = alt.admission if alt is not None and alt.admission is not None else admission
            for d in self.decodes:
                own = alt_admission if d.instance_id in self._alt_ids else admission
                self._admit[d.instance_id] = DecodeAdmissionQueue(d, own, ctx.slo)
        self._keeper = KVKeeper(ctx, self.decodes, self.policies, self.fabric) if opts.retention else None
        decode_perf = ctx.role_perf.get(Role.DECODE, ctx.perf)
        self._kv_bytes = decode_perf.kv_bytes_per_token
        self._turns: dict[str, _Turn] = {}
        self._banked = BankedPrefills(ctx, self.decodes, lambda d: (
            self._alt_placement if d in self._alt_ids and self._alt_placement else self._placement),
            OutputLengths() if opts.tpot_bank_forward else None) if banked else None
        self._mover: HeldTurnMover | None = None  # a local turn that would wait for memory moves (held_move.py)
        if opts.move_held_turns and self._binder is not None and self._keeper is not None and self._admit:
            self._mover = HeldTurnMover(self._binder, self._keeper, self.decodes, self._admit, self._run_local)
        self._turn_mover: QueuedTurnMover | None = None  # a turn queued on its instance moves (turn_move.py)
        if opts.move_queued_turns and self._binder is not None and self._keeper is not None:
            self._turn_mover = QueuedTurnMover(self._binder, self._keeper, self.decodes, self._admit,
                                               decode_perf, cfg.max_num_batched_tokens)
        self.local_prefills = self.remote_prefills = 0

    # ---- arrival: bind, place ----------------------------------------------------------------
    def submit(self, request: Request, now: float) -> None:
        if self._keeper is not None:
            self._keeper.on_arrival(request, now)
        decode = self._bind(request, now)
        if self._turn_mover is not None:
            decode = self._turn_mover.place(request, decode, now)
        on_decode = self._history_on_decode(request, decode)
        placement: PlacementDecision | None = None
        policy = self._alt_placement if decode.instance_id in self._alt_ids else self._placement
        if policy is None:  # no placement: remote, or local when there is no prefill instance (rule 1)
            local = not self._prefill_views
            prefill_id = "" if local else self._router.choose(request, self._prefill_views, now)
        else:
            placement = policy.decide(
                request,
                decode=decode.engine,
                prefills=self._prefill_views,
                slo=self.ctx.slo,
                now=now,
                history_cached_tokens_on_decode=on_decode,
                prefill_backlog_tokens={pid: q.backlog_tokens() for pid, q in self._queues.items()},
                link_wait_s=self._link_waits(decode.instance_id, now) if self.ctx.config.ampd.link_aware else None,
                tpot_bank_s=self._banked.bank_s(decode, now) if self._banked is not None else None,
            )
            local, prefill_id = placement.local, placement.prefill_instance or ""
        turn = _Turn(request, decode.instance_id, local, prefill_id, placement=placement)
        self._turns[request.request_id] = turn
        if local:
            self.local_prefills += 1
            self._run_local(turn, now)
        else:
            self.remote_prefills += 1
            self._enqueue_remote(turn, now)

    def _link_waits(self, decode_id: str, now: float) -> dict[str, float]:
        """What placement reads of the KV network, per prefill instance: the queueing on the
        ports a remote prefill there would use (the history pull into it from ``decode_id``, the
        prompt KV's way back into ``decode_id``)."""
        fabric = self.fabric
        assert fabric is not None
        return {
            p.instance_id: fabric.wait_s(decode_id, p.instance_id, now) + fabric.wait_s(p.instance_id, decode_id, now)
            for p in self.prefills
        }

    def _history_on_decode(self, request: Request, decode: SimInstance) -> int:
        """Prompt-prefix tokens whose KV the decode instance holds, on GPU or in host memory."""
        on_gpu = decode.engine.cached_prefix_tokens(request.content, request.prompt_tokens)
        if self._keeper is None:
            return on_gpu
        return max(on_gpu, self._keeper.host_tokens(request, decode.instance_id))

    def _bind(self, request: Request, now: float) -> SimInstance:
        if self._binder is None:
            return self._by_id[self._decode_router.choose(request, self._decode_views, now)]
        decision = self._binder.bind(request, self._decode_views, now)
        decode = self._by_id[decision.instance_id]
        if decision.move_history and decision.from_instance in self._by_id and self._keeper is not None:
            old = self._by_id[decision.from_instance]
            self._keeper.move_history(request, old, decode, now)
        return decode

    def _run_local(self, turn: _Turn, now: float) -> None:
        decode = self._by_id[turn.decode_id]
        ready, preloaded = now, 0
        if self._keeper is not None:
            ready, preloaded = self._keeper.reload(turn.request, decode, now)
        if ready > now:
            self.ctx.loop.at(ready, lambda: self._admit_on_decode(turn, ready, preloaded, kv_arrived=False))
        else:
            self._admit_on_decode(turn, now, preloaded, kv_arrived=False)

    def _admit_on_decode(self, turn: _Turn, now: float, preloaded: int, *, kv_arrived: bool) -> None:
        """Hand ``turn`` to its decode instance, through the admission queue when there is one
        (``kv_arrived``: a remote turn whose prompt KV is there; else a local turn)."""
        req = turn.request
        decode = self._by_id[turn.decode_id]

        def submit(at: float) -> None:
            if kv_arrived:
                # Its prefill is done: in the engine it goes ahead of local prefills waiting there.
                decode.submit(req, at, preloaded_tokens=req.prompt_tokens, emitted_tokens=1, continuation=True)
            else:  # a local prefill, in the chunks placement sized to the batch's ITL slack
                chunk = turn.placement.chunk_tokens if turn.placement is not None else 0
                decode.submit(req, at, preloaded_tokens=preloaded, max_chunk_tokens=chunk)
                if self._banked is not None:
                    self._banked.start(decode, req.request_id, req.prompt_tokens)
            if self._banked is not None:
                self._banked.resize(decode, at)

        queue = self._admit.get(turn.decode_id)
        if queue is None:
            submit(now)
            return
        on_gpu = decode.engine.cached_prefix_tokens(req.content, req.prompt_tokens)
        cached = max(preloaded, on_gpu)
        # With held turns moved, reloaded history counts as blocks, as the engine counts it (held_move.py).
        have = 0 if kv_arrived else (on_gpu if self._mover is not None else cached)
        task = AdmissionTask(request_id=req.request_id, arrival_s=req.arrival_s,
                             prefill_tokens=0 if kv_arrived else req.prompt_tokens - cached, cached_tokens=cached,
                             blocks=-(-(req.prompt_tokens + req.max_output_tokens - have)
                                      // decode.engine.block_size_tokens))
        if not kv_arrived and self._mover is not None and self._mover.try_move(turn, task, queue, now):
            return
        queue.push(task, submit, now)

    # ---- remote prefill ----------------------------------------------------------------------
    def _enqueue_remote(self, turn: _Turn, now: float) -> None:
        queue = self._queues[turn.prefill_id]
        req = turn.request
        cached = queue.instance.engine.cached_prefix_tokens(req.content, req.prompt_tokens)
        task = PrefillTask(
            request_id=req.request_id,
            arrival_s=req.arrival_s,
            deadline_s=req.arrival_s + self.ctx.slo.ttft_s,
            new_tokens=req.prompt_tokens - cached,
            cached_tokens=cached,
        )
        queue.push(task, lambda t: self._dispatch_remote(turn, t), now)

    def _dispatch_remote(self, turn: _Turn, now: float) -> None:
        """Popped from the prefill queue: fetch the history the prefill node lacks, then prefill."""
        req = turn.request
        queue = self._queues[turn.prefill_id]
        prefill = queue.instance
        cached_p = prefill.engine.cached_prefix_tokens(req.content, req.prompt_tokens)
        on_decode = self._history_on_decode(req, self._by_id[turn.decode_id])
        history = min(req.history_tokens, on_decode)
        from_decode = max(0, history - cached_p)
        preloaded = max(cached_p, history)
        todo = req.prompt_tokens - preloaded
        if from_decode == 0:
            prefill.submit(req, now, preloaded_tokens=preloaded, prefill_only=True)
            return
        queue.in_flight_tokens += todo
        sent = now if self._keeper is None else max(now, self._keeper.history_ready_s(req.session_id))
        fabric = self.fabric
        assert fabric is not None

        def start() -> None:
            queue.in_flight_tokens -= todo
            prefill.submit(req, self.ctx.loop.now, preloaded_tokens=preloaded, prefill_only=True)

        def cut() -> None:
            queue.in_flight_tokens -= todo
            queue.pump(self.ctx.loop.now)
            del self._turns[req.request_id]
            self.ctx.done(req, unfinished_record(turn))

        def send() -> None:
            fabric.send(turn.decode_id, prefill.instance_id, from_decode * self._kv_bytes,
                        self.ctx.loop.now, start, kind="history_pull", on_timeout=cut)

        if sent > now:
            self.ctx.loop.at(sent, send)
        else:
            send()

    # ---- completions -------------------------------------------------------------------------
    def _on_step(self, instance: SimInstance, result: StepResult) -> None:
        super()._on_step(instance, result)
        if self._banked is not None and instance.engine.role is Role.DECODE:
            self._banked.resize(instance, result.end_s)  # the streams' bank changed with the step

    def on_finished(self, instance: SimInstance, fin: FinishedRequest) -> None:
        turn = self._turns[fin.request_id]
        if instance.engine.role is Role.PREFILL:
            self._queues[instance.instance_id].pump(fin.finish_s)
            self._after_prefill(turn, instance, fin)
        else:
            if self._banked is not None and self._banked.lengths is not None:
                self._banked.lengths.observe(fin.output_tokens)
            self._after_decode(turn, instance, fin)
            queue = self._admit.get(instance.instance_id)
            if queue is not None:
                queue.pump(fin.finish_s)

    def _after_prefill(self, turn: _Turn, instance: SimInstance, fin: FinishedRequest) -> None:
        turn.prefill = fin
        req = turn.request
        if req.max_output_tokens <= 1:
            self._finish(turn, None)
            return
        decode = self._by_id[turn.decode_id]
        on_decode = decode.engine.cached_prefix_tokens(req.content, req.prompt_tokens)
        send = req.prompt_tokens - on_decode
        assert self.fabric is not None

        def cut() -> None:
            del self._turns[req.request_id]
            self.ctx.done(req, unfinished_record(turn))

        self.fabric.send(instance.instance_id, turn.decode_id, send * self._kv_bytes, fin.finish_s,
                         lambda: self._arrive_on_decode(turn), kind="prompt_kv", on_timeout=cut)

    def _arrive_on_decode(self, turn: _Turn) -> None:
        now = self.ctx.loop.now
        turn.kv_arrived_s = now
        self._admit_on_decode(turn, now, turn.request.prompt_tokens, kv_arrived=True)

    def _after_decode(self, turn: _Turn, instance: SimInstance, fin: FinishedRequest) -> None:
        if self._keeper is not None:
            self._keeper.on_turn_end(turn.request, instance, fin.finish_s)
        if turn.local:
            del self._turns[turn.request.request_id]
            self.ctx.done(turn.request, single_record(turn.request, fin, turn.decode_id))
        else:
            self._finish(turn, fin)

    def _finish(self, turn: _Turn, dec: FinishedRequest | None) -> None:
        del self._turns[turn.request.request_id]
        assert turn.prefill is not None
        record = split_record(
            turn.request,
            turn.prefill,
            dec,
            kv_arrived_s=turn.kv_arrived_s,
            prefill_instance=turn.prefill_id,
            decode_instance=turn.decode_id,
        )
        self.ctx.done(turn.request, record)

    def unfinished(self) -> list[Request]:
        return [t.request for t in self._turns.values()]
