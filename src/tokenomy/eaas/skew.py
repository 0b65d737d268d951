"""Load-skew experiment behind ``benchmarks/eaas_balance.py``: Zipf expert popularity, a naive
placement, then hot-expert replication and rebalancing from the measured per-expert load.

Both placements get the same memory budget (``slots_per_server`` expert copies per server); the naive
one spends it on uniform replicas, the plan on the hot experts. Tokens are routed through the real
``RoutingTable`` (round-robin over replicas) and counted by the ``Registry``, as the client does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tokenomy.eaas.balance import Placement, max_over_mean, naive_placement, plan_placement
from tokenomy.eaas.registry import Registry, RoutingTable


@dataclass(frozen=True)
class SkewConfig:
    n_experts: int = 16
    top_k: int = 4
    n_servers: int = 8
    slots_per_server: int = 4     # expert copies one server holds (memory budget)
    zipf_exponent: float = 1.2
    batches: int = 400
    batch_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.slots_per_server * self.n_servers < self.n_experts:
            raise ValueError(f"{self.n_servers} servers x {self.slots_per_server} slots cannot hold "
                             f"{self.n_experts} experts")
        if self.zipf_exponent < 0 or not 1 <= self.top_k <= self.n_experts:
            raise ValueError("need zipf_exponent >= 0 and 1 <= top_k <= n_experts")


@dataclass
class SkewReport:
    max_over_mean_before: float
    max_over_mean_after: float
    loads_before: dict[str, int]
    loads_after: dict[str, int]
    placement_after: dict[str, list[int]]
    expert_tokens: dict[int, int]
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def zipf_popularity(n_experts: int, exponent: float, seed: int = 0) -> torch.Tensor:
    """Probability of each expert id: rank r gets 1/r^exponent; ranks shuffled over ids by ``seed``."""
    weights = torch.arange(1, n_experts + 1, dtype=torch.float64) ** -exponent
    perm = torch.randperm(n_experts, generator=torch.Generator().manual_seed(seed))
    return (weights / weights.sum())[perm]


def route_stream(registry: Registry, cfg: SkewConfig, popularity: torch.Tensor, seed: int) -> dict[str, int]:
    """Route ``cfg.batches`` batches (top-k experts per token, drawn by popularity) and count per server."""
    table = RoutingTable(registry)
    gen = torch.Generator().manual_seed(seed)
    registry.server_tokens.clear()
    for _ in range(cfg.batches):
        ids = torch.multinomial(popularity.expand(cfg.batch_tokens, -1), cfg.top_k, generator=gen)
        experts, counts = torch.unique(ids, return_counts=True)
        for e, n in zip(experts.tolist(), counts.tolist(), strict=True):
            registry.record(table.pick(e).server_id, e, n)
    return {s.server_id: registry.server_tokens[s.server_id] for s in registry.servers()}


def _registry(placement: Placement) -> Registry:
    reg = Registry()
    for sid, ids in placement.items():
        if ids:
            reg.register(sid, f"inproc://{sid}", ids)  # no process: placement and counting only
    return reg


def run_skew(cfg: SkewConfig) -> SkewReport:
    popularity = zipf_popularity(cfg.n_experts, cfg.zipf_exponent, cfg.seed)
    servers = [f"s{i}" for i in range(cfg.n_servers)]
    uniform = max(1, min(cfg.n_servers, cfg.slots_per_server * cfg.n_servers // cfg.n_experts))
    before_reg = _registry(naive_placement(cfg.n_experts, servers, uniform))
    loads_before = route_stream(before_reg, cfg, popularity, cfg.seed)
    stats = {e: float(before_reg.expert_tokens[e]) for e in range(cfg.n_experts)}
    placement = plan_placement(stats, servers, cfg.slots_per_server)
    loads_after = route_stream(_registry(placement), cfg, popularity, cfg.seed + 1)
    return SkewReport(
        max_over_mean_before=max_over_mean({k: float(v) for k, v in loads_before.items()}),
        max_over_mean_after=max_over_mean({k: float(v) for k, v in loads_after.items()}),
        loads_before=loads_before, loads_after=loads_after,
        placement_after={k: list(v) for k, v in placement.items()},
        expert_tokens={e: int(v) for e, v in sorted(before_reg.expert_tokens.items())}, config=asdict(cfg),
    )
