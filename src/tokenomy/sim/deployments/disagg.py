"""DistServe-style PD disaggregation: P prefill instances, D decode instances, KV shipped between them.

Every turn is a new request: it is prefilled on a prefill instance (prefix reuse only from
that instance's own cache), its first token is sampled there, its whole prompt KV is sent
over the decode instance's inbound link (FIFO), then it decodes there. As in vLLM's
disaggregation proxy, the client streams from the decode side, so the first token reaches
the client when the KV has arrived there: TTFT = queue + prefill + transfer. The prefill
instance's blocks become free-cached as soon as its part finishes (the transfer is modelled
on the KV fabric's shared ports, not as memory held on the prefill side). A transfer cut by
``kv_transfer_timeout_s`` leaves its request incomplete.

With ``SimConfig.host_kv_tier`` the prefill instances get AMPD's host KV tier (Dynamo
KVBM-style): when a prefill finishes, the retention policy keeps, offloads or drops the
prompt's KV there, and the session's next turn, routed to the same prefill instance by session
affinity, reloads what that GPU's cache lost from host memory over PCIe instead of
recomputing it. Same policies, host memory and PCIe model as AMPD.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenomy.core import Request, Role
from tokenomy.engine import FinishedRequest
from tokenomy.perf import PerfModel
from tokenomy.policy.router import make_router
from tokenomy.sim.base import Deployment, SimContext, incomplete_record, register_deployment, split_record
from tokenomy.sim.deployments.kv_keeper import KVKeeper
from tokenomy.sim.deployments.policies import sim_policies
from tokenomy.sim.instance import SimInstance
from tokenomy.sim.link import KVFabric


@dataclass(slots=True)
class _Prefilled:
    request: Request
    prefill: FinishedRequest
    prefill_instance: str
    kv_arrived_s: float | None = None


def kv_fabric(ctx: SimContext, instances: list[SimInstance]) -> KVFabric:
    """The inbound KV ports of ``instances`` (:class:`~tokenomy.sim.link.KVFabric`): every TP rank
    has its own NIC and NVLink port, so an instance's RDMA port carries the config's or the
    GPU's inter-node bandwidth times TP, its NVLink port the intra-node bandwidth times TP; each
    transfer pays the perf model's setup latency (so a lone transfer over RDMA takes exactly
    ``perf.kv_transfer_time_s``). Instances fill nodes of ``gpus_per_node`` GPUs in the order
    given; a GPU of another type starts a new node."""
    cfg = ctx.config
    ports: dict[str, tuple[float, float]] = {}
    node_of: dict[str, int] = {}
    node, used, node_gpu = 0, 0, None
    for inst in instances:
        perf = inst.engine.perf if isinstance(inst.engine.perf, PerfModel) else ctx.perf
        rdma = cfg.link_bytes_per_s or perf.gpu.inter_node_bytes_per_s * perf.tp
        ports[inst.instance_id] = (perf.gpu.intra_node_bytes_per_s * perf.tp, rdma)
        if cfg.gpus_per_node is None:
            node += 1
        elif node_gpu != perf.gpu.name or used + perf.tp > cfg.gpus_per_node:
            node, used, node_gpu = node + 1, 0, perf.gpu.name
        node_of[inst.instance_id] = node
        used += perf.tp
    return KVFabric(ctx.loop, ports, node_of, latency_s=ctx.perf.coeffs.kv_transfer_setup_s,
                    timeout_s=cfg.kv_transfer_timeout_s)


@register_deployment
class Disaggregated(Deployment):
    name = "disagg"

    def __init__(self, ctx: SimContext) -> None:
        super().__init__(ctx)
        self.prefills = [self._make_instance(f"prefill-{i}", Role.PREFILL) for i in range(ctx.config.prefill)]
        # Decode steps carry one token per sequence: the budget only has to cover the batch.
        budget = max(ctx.config.max_num_batched_tokens, ctx.config.decode_max_num_seqs)
        self.decodes = self._make_decodes(budget)
        self._by_id = {inst.instance_id: inst for inst in self.instances}
        self._prefill_views = [inst.engine for inst in self.prefills]
        self._decode_views = [inst.engine for inst in self.decodes]
        self._router = make_router(ctx.config.router)
        self._decode_router = make_router(ctx.config.decode_router)
        self.fabric = kv_fabric(ctx, self.instances)
        self._prefilling: dict[str, Request] = {}
        self._decoding: dict[str, _Prefilled] = {}
        self._in_transfer: dict[str, _Prefilled] = {}
        self._keeper = KVKeeper(ctx, self.prefills, sim_policies(ctx), self.fabric) if ctx.config.host_kv_tier else None

    def submit(self, request: Request, now: float) -> None:
        target = self._by_id[self._router.choose(request, self._prefill_views, now)]
        self._prefilling[request.request_id] = request
        if self._keeper is None:
            target.submit(request, now, prefill_only=True)
            return
        self._keeper.on_arrival(request, now)
        ready, preloaded = self._keeper.reload(request, target, now)
        if ready > now:
            self.ctx.loop.at(
                ready, lambda: target.submit(request, ready, preloaded_tokens=preloaded, prefill_only=True)
            )
        else:
            target.submit(request, now, preloaded_tokens=preloaded, prefill_only=True)

    def on_finished(self, instance: SimInstance, fin: FinishedRequest) -> None:
        if instance.engine.role is Role.PREFILL:
            self._after_prefill(instance, fin)
        else:
            self._after_decode(instance, fin)

    def _after_prefill(self, instance: SimInstance, fin: FinishedRequest) -> None:
        request = self._prefilling.pop(fin.request_id)
        now = fin.finish_s
        if self._keeper is not None:
            # The prompt's KV stays here for the session's next turn; its tool has not started yet.
            self._keeper.on_turn_end(request, instance, now, kv_tokens=request.prompt_tokens, tool_starts=False)
        if request.max_output_tokens <= 1:
            self._finish(_Prefilled(request, fin, instance.instance_id), None, instance.instance_id)
            return
        target = self._decode_router.choose(request, self._decode_views, now)
        kv_bytes = request.prompt_tokens * self.ctx.role_perf.get(Role.DECODE, self.ctx.perf).kv_bytes_per_token
        state = _Prefilled(request, fin, instance.instance_id)
        self._in_transfer[request.request_id] = state
        assert self.fabric is not None
        self.fabric.send(instance.instance_id, target, kv_bytes, now, lambda: self._arrive_on_decode(target, state),
                         kind="prompt_kv", on_timeout=lambda: self._timed_out(state))

    def _timed_out(self, state: _Prefilled) -> None:
        """The KV transfer was cut: the request is incomplete (recorded, never dropped)."""
        del self._in_transfer[state.request.request_id]
        self.ctx.done(state.request, incomplete_record(state.request, state.prefill, state.prefill_instance))

    def _arrive_on_decode(self, target: str, state: _Prefilled) -> None:
        del self._in_transfer[state.request.request_id]
        state.kv_arrived_s = self.ctx.loop.now
        self._decoding[state.request.request_id] = state
        self._by_id[target].submit(
            state.request, self.ctx.loop.now, preloaded_tokens=state.request.prompt_tokens, emitted_tokens=1
        )

    def _after_decode(self, instance: SimInstance, fin: FinishedRequest) -> None:
        state = self._decoding.pop(fin.request_id)
        if self._keeper is not None:
            self._keeper.tool_started(state.request.session_id, fin.finish_s)
        self._finish(state, fin, instance.instance_id)

    def _finish(self, state: _Prefilled, dec: FinishedRequest | None, decode_id: str) -> None:
        record = split_record(
            state.request,
            state.prefill,
            dec,
            kv_arrived_s=state.kv_arrived_s,
            prefill_instance=state.prefill_instance,
            decode_instance=decode_id,
        )
        self.ctx.done(state.request, record)

    def unfinished(self) -> list[Request]:
        return (
            list(self._prefilling.values())
            + [s.request for s in self._in_transfer.values()]
            + [s.request for s in self._decoding.values()]
        )
