"""Colocated serving: N mixed instances behind a router (chunked prefill, prefix caching).

With ``SimConfig.host_kv_tier`` every instance also gets AMPD's host KV tier (LMCache-style
CPU offload): at the end of each turn the retention policy keeps, offloads or drops the
session's KV, and the session's next turn reloads what its instance's GPU cache lost from host
memory over PCIe instead of recomputing it. Same policies, host memory and PCIe model as AMPD;
like AMPD's rebinding, a session the router moves to another instance takes its history KV along
over that instance's inbound KV link (``KVKeeper.follow``).
"""

from __future__ import annotations

from tokenomy.core import Request, Role
from tokenomy.engine import FinishedRequest
from tokenomy.perf import PerfModel
from tokenomy.policy.router import make_router
from tokenomy.sim.base import Deployment, SimContext, register_deployment, single_record
from tokenomy.sim.deployments.disagg import kv_fabric
from tokenomy.sim.deployments.kv_keeper import KVKeeper
from tokenomy.sim.deployments.policies import sim_policies
from tokenomy.sim.instance import SimInstance


@register_deployment
class Colocated(Deployment):
    """Every instance prefills and decodes; a router picks one per request."""

    name = "colocated"

    def __init__(self, ctx: SimContext) -> None:
        super().__init__(ctx)
        cfg = ctx.config
        if cfg.mixed_pools is None:
            for i in range(cfg.instances):
                self._make_instance(f"mixed-{i}", Role.MIXED)
        else:  # a mixed inventory: every GPU type runs as mixed instances of its own shape
            i = 0
            for gpu, tp, count in cfg.mixed_pools:
                perf = PerfModel.from_names(cfg.model, gpu, tp)
                for _ in range(count):
                    self._make_instance(f"mixed-{i}", Role.MIXED, perf=perf)
                    i += 1
        self._by_id = {inst.instance_id: inst for inst in self.instances}
        self._views = [inst.engine for inst in self.instances]
        self._router = make_router(ctx.config.router)
        self._inflight: dict[str, Request] = {}
        if ctx.config.host_kv_tier:
            self.fabric = kv_fabric(ctx, self.instances)
        self._keeper = KVKeeper(ctx, self.instances, sim_policies(ctx), self.fabric) if self.fabric else None
        if self._keeper is None and cfg.admission is None:
            # A finished turn is recorded and its session's next turn scheduled: nothing reads
            # another instance (an admission gate may submit a queued request, the KV keeper reads
            # the instances), so the other instances need not be synced first.
            for inst in self.instances:
                inst.sync_on_finish = False

    def submit(self, request: Request, now: float) -> None:
        target = self._by_id[self._router.choose(request, self._views, now)]
        self._inflight[request.request_id] = request
        if self._keeper is None:
            target.submit(request, now)
            return
        self._keeper.on_arrival(request, now)
        self._keeper.follow(request, target, now)
        ready, preloaded = self._keeper.reload(request, target, now)
        if ready > now:
            self.ctx.loop.at(ready, lambda: target.submit(request, ready, preloaded_tokens=preloaded))
        else:
            target.submit(request, now, preloaded_tokens=preloaded)

    def on_finished(self, instance: SimInstance, fin: FinishedRequest) -> None:
        request = self._inflight.pop(fin.request_id)
        if self._keeper is not None:
            self._keeper.on_turn_end(request, instance, fin.finish_s)
        self.ctx.done(request, single_record(request, fin, instance.instance_id))

    def unfinished(self) -> list[Request]:
        return list(self._inflight.values())
