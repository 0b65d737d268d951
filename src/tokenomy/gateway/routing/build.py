"""The route step of ``routing.mode``, built from the config."""

from __future__ import annotations

import httpx

from tokenomy.gateway.routing.ampd_live import AmpdLive, AmpdRouting
from tokenomy.gateway.routing.backends import BackendPool
from tokenomy.gateway.routing.config import RoutingConfig
from tokenomy.gateway.routing.pd import Disagg
from tokenomy.gateway.routing.route import Colocated, Routing
from tokenomy.gateway.routing.upstream import UpstreamPool
from tokenomy.policy.router import Router


def build_routing(config: RoutingConfig, pool: BackendPool, upstream: UpstreamPool, router: Router,
                  http: httpx.AsyncClient) -> Routing:
    """``colocated``: :class:`Colocated`; ``disagg``: :class:`Disagg`; ``ampd``: :class:`AmpdRouting`
    (``http``, an httpx client, sends AMPD's retention hints)."""
    if config.mode == "disagg":
        return Disagg(pool, upstream, router)
    if config.mode == "ampd":
        return AmpdRouting(AmpdLive.build(config, pool, http), upstream, router)
    return Colocated(pool, router)
