"""Colocated serving: N mixed instances behind a router (chunked prefill, prefix caching)."""

from __future__ import annotations

from tokenomy.core import Request, Role
from tokenomy.engine import FinishedRequest
from tokenomy.policy.router import make_router
from tokenomy.sim.base import Deployment, SimContext, register_deployment, single_record
from tokenomy.sim.instance import SimInstance


@register_deployment
class Colocated(Deployment):
    """Every instance prefills and decodes; a router picks one per request."""

    name = "colocated"

    def __init__(self, ctx: SimContext) -> None:
        super().__init__(ctx)
        for i in range(ctx.config.instances):
            self._make_instance(f"mixed-{i}", Role.MIXED)
        self._by_id = {inst.instance_id: inst for inst in self.instances}
        self._views = [inst.engine for inst in self.instances]
        self._router = make_router(ctx.config.router)
        self._inflight: dict[str, Request] = {}

    def submit(self, request: Request, now: float) -> None:
        target = self._router.choose(request, self._views, now)
        self._inflight[request.request_id] = request
        self._by_id[target].submit(request, now)

    def on_finished(self, instance: SimInstance, fin: FinishedRequest) -> None:
        request = self._inflight.pop(fin.request_id)
        self.ctx.done(request, single_record(request, fin, instance.instance_id))

    def unfinished(self) -> list[Request]:
        return list(self._inflight.values())
