"""``routing.mode: disagg``: every request prefills remotely, then decodes where the router says.

The route step picks the decode backend (the router, over the decode pool), then runs the remote
prefill (:class:`tokenomy.gateway.routing.prefill.PrefillHop`) on the least loaded prefill backend
that can be reached; the forward step then sends the decode request with the ``kv_transfer_params``
it answered. A prefill backend that cannot be reached is marked down and the next one is tried;
when none is left the decode backend prefills locally (logged), so a P pool outage degrades,
never fails. ``ampd`` mode decides the same things by AMPD's policies
(:mod:`tokenomy.gateway.routing.ampd_live`).
"""

from __future__ import annotations

import logging
import time

from tokenomy.core import Role
from tokenomy.gateway.http.parse import ParsedRequest
from tokenomy.gateway.routing.backends import BackendPool
from tokenomy.gateway.routing.prefill import PrefillHop
from tokenomy.gateway.routing.route import DecodeRoute, core_request, decode_candidates, role_candidates
from tokenomy.gateway.routing.upstream import UpstreamPool
from tokenomy.policy.router import Router

log = logging.getLogger(__name__)


class Disagg:
    """The route step of ``disagg``: decode by the router, prefill remotely first."""

    def __init__(self, pool: BackendPool, upstream: UpstreamPool, router: Router) -> None:
        self.pool = pool
        self.router = router
        self.hop = PrefillHop(pool, upstream)

    async def route(self, req: ParsedRequest) -> DecodeRoute:
        decodes = decode_candidates(self.pool, req.model)
        prefills = role_candidates(self.pool, Role.PREFILL, req.model)
        now = time.monotonic()
        decode_id = self.router.choose(core_request(req, now), decodes, now)
        order = sorted(prefills, key=lambda b: (b.num_waiting_tokens, b.in_flight, b.instance_id))
        reason = "disagg: every prefill runs remotely"
        hop = await self.hop.first_reachable(req, order)
        if hop is None:
            if order:
                log.warning("request %s: no prefill backend reachable; %s prefills locally", req.request_id, decode_id)
                reason += "; no prefill backend reachable: local"
            return DecodeRoute(self.pool, self.router, decode_id, reason)
        prefill, params = hop
        return DecodeRoute(self.pool, self.router, decode_id, reason, params, prefill.instance_id)
