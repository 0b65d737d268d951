"""Tier-aware routing bias: under load, higher tiers get the best instance, lower tiers spill.

``tier_aware`` (registered in :data:`~tokenomy.policy.router.ROUTERS`): while the cluster is not
loaded every request goes through the ``base`` router (default ``session_affinity``). Under load
(every instance has at least ``busy_waiting_tokens`` prompt tokens queued, or the mean KV usage is
at least ``busy_kv_usage``) a request of a tier in ``top_tiers`` goes to the instance of least
:func:`~tokenomy.policy.router.prefix_cost_blocks` (where its prefix is cached, or the queue is
shortest); any other request is routed by ``base`` among the instances left after setting aside
the ``reserve_fraction`` least loaded ones (rounded down: none of 2 at the default) for the top
tiers. Thresholds are labelled defaults
(docs/closed-loop.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tokenomy.core import Request
from tokenomy.policy.router import ROUTERS, Router, cheapest_instance, make_router
from tokenomy.policy.trace import TraceSink
from tokenomy.policy.view import InstanceView


@ROUTERS.register("tier_aware")
class TierAwareRouter:
    """See the module docstring. ``trace`` receives one ``tier_route`` event per biased decision."""

    def __init__(self, base: str = "session_affinity", top_tiers: Sequence[str] = ("gold",),
                 busy_waiting_tokens: int = 2048, busy_kv_usage: float = 0.85, reserve_fraction: float = 0.34,
                 overlap_weight: float = 1.0, trace: TraceSink | None = None) -> None:
        if base == "tier_aware":
            raise ValueError("tier_aware cannot be its own base router")
        if busy_waiting_tokens < 0:
            raise ValueError(f"busy_waiting_tokens must be >= 0, got {busy_waiting_tokens}")
        if not 0 < busy_kv_usage <= 1:
            raise ValueError(f"busy_kv_usage must be in (0, 1], got {busy_kv_usage}")
        if not 0 <= reserve_fraction < 1:
            raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction}")
        self.base: Router = make_router(base)
        self.top_tiers = frozenset(top_tiers)
        self.busy_waiting_tokens = busy_waiting_tokens
        self.busy_kv_usage = busy_kv_usage
        self.reserve_fraction = reserve_fraction
        self.overlap_weight = overlap_weight
        self.trace = trace

    def loaded(self, instances: Sequence[InstanceView]) -> bool:
        """Whether the cluster is under load (module docstring)."""
        if not instances:
            return False
        queued = min(v.num_waiting_tokens for v in instances) >= max(1, self.busy_waiting_tokens)
        kv = sum(v.kv_usage for v in instances) / len(instances) >= self.busy_kv_usage
        return queued or kv

    def choose(self, request: Request, instances: Sequence[InstanceView], now: float) -> str:
        if not instances:
            raise ValueError("no instances to route to")
        if len(instances) < 2 or not self.loaded(instances):
            return self.base.choose(request, instances, now)
        if request.tier in self.top_tiers:
            best = cheapest_instance(request, instances, self.overlap_weight)
            self._emit(now, request, best, "top tier under load: cached prefix or shortest queue")
            return best
        reserve = min(len(instances) - 1, math.floor(self.reserve_fraction * len(instances)))
        by_load = sorted(instances, key=lambda v: (v.num_waiting_tokens, v.num_running + v.num_waiting,
                                                    v.instance_id))
        rest = by_load[reserve:]
        chosen = self.base.choose(request, rest, now)
        self._emit(now, request, chosen, f"lower tier under load: spilled past the {reserve} least loaded")
        return chosen

    def _emit(self, now: float, request: Request, instance: str, reason: str) -> None:
        if self.trace is not None:
            self.trace({"kind": "tier_route", "t_s": now, "request_id": request.request_id, "tier": request.tier,
                        "instance": instance, "reason": reason})
