"""The failover experiment behind ``benchmarks/eaas_failover.py`` and ``tokenomy eaas demo``.

Start ``n_servers`` expert servers with every expert on ``replicas`` of them, stream micro-batches
through one attention client, SIGKILL one server at ``kill_at_s`` and measure throughput before,
during (the recovery window) and after, plus lost and wrong tokens against the monolithic reference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tokenomy.eaas.balance import naive_placement
from tokenomy.eaas.client import AttentionClient
from tokenomy.eaas.config import preset
from tokenomy.eaas.launcher import start_servers, stop_all
from tokenomy.eaas.moe import MoEWeights
from tokenomy.eaas.registry import Registry, RoutingTable
from tokenomy.eaas.stream import StreamEvent, run_stream


@dataclass(frozen=True)
class FailoverConfig:
    n_servers: int = 4
    replicas: int = 2
    duration_s: float = 8.0
    kill_at_s: float | None = 4.0   # None: no failure, just stream
    kill: bool = True               # False: a control run, same windows, no kill (measures the noise floor)
    recovery_window_s: float = 1.0  # "during" = [kill, kill + window)
    warmup_s: float = 0.5           # excluded from "before": connection set-up and first calls
    batch_tokens: int = 32
    max_tokens: int | None = None   # stop early once this many tokens were sent
    timeout_s: float = 0.5          # per request; a crash is usually seen sooner via the dropped connection
    preset: str = "deepseek-tiny"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_servers < 1 or not 1 <= self.replicas <= self.n_servers:
            raise ValueError(f"need n_servers >= 1 and 1 <= replicas <= n_servers, got {self.n_servers}, "
                             f"{self.replicas}")
        if self.kill_at_s is not None:
            if self.kill and self.replicas < 2:
                raise ValueError("killing a server without a second replica loses its experts; use replicas >= 2")
            if not self.warmup_s < self.kill_at_s < self.duration_s:
                raise ValueError(f"kill_at_s must lie in ({self.warmup_s}, {self.duration_s}), got {self.kill_at_s}")


@dataclass
class FailoverReport:
    throughput_before_tps: float
    throughput_during_tps: float
    throughput_after_tps: float
    drop_fraction: float
    lost_tokens: int
    wrong_tokens: int
    tokens_done: int
    failovers: int
    max_gap_in_window_s: float      # longest wait between completed batches inside the recovery window
    median_gap_s: float             # typical wait between completed batches (one batch's latency)
    max_abs_err: float
    killed_server: str | None
    config: dict[str, Any]
    server_tokens: dict[str, int] = field(default_factory=dict)
    per_second_tps: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_failover(cfg: FailoverConfig) -> FailoverReport:
    """Run the experiment; every server started here is stopped before returning or raising."""
    torch.set_num_threads(1)
    model = preset(cfg.preset)
    weights = MoEWeights.from_seed(model, cfg.seed)
    ids = [f"s{i}" for i in range(cfg.n_servers)]
    servers = start_servers(naive_placement(model.n_experts, ids, cfg.replicas), preset=cfg.preset, seed=cfg.seed)
    registry = Registry()
    client: AttentionClient | None = None
    try:
        for s in servers:
            registry.register(s.server_id, s.address, s.expert_ids)
        client = AttentionClient(weights, RoutingTable(registry), timeout_s=cfg.timeout_s)
        victim = servers[0]
        events: tuple[StreamEvent, ...] = ()
        if cfg.kill_at_s is not None and cfg.kill:
            events = (StreamEvent(cfg.kill_at_s, f"kill {victim.server_id}", lambda: victim.kill(wait=False)),)
        res = run_stream(client, weights, cfg.duration_s, cfg.batch_tokens, cfg.seed, events,
                         max_tokens=cfg.max_tokens)
    finally:
        if client is not None:
            client.close()
        stop_all(servers)
    end = res.duration_s
    t_kill = res.events[0][0] if res.events else cfg.kill_at_s
    gaps = [b[0] - a[0] for a, b in zip(res.completions, res.completions[1:], strict=False)]
    window_gaps: list[float] = []
    if t_kill is None or t_kill >= end:  # no kill requested, or the stream ended before it
        before = res.throughput_tps(min(cfg.warmup_s, end / 2), end)
        during = after = before
    else:
        t_rec = min(t_kill + cfg.recovery_window_s, end)
        window_gaps = [b[0] - max(a[0], t_kill) for a, b in zip(res.completions, res.completions[1:], strict=False)
                       if t_kill <= b[0] < t_rec]
        before = res.throughput_tps(cfg.warmup_s, t_kill)
        during = res.throughput_tps(t_kill, t_rec)
        after = res.throughput_tps(t_rec, end)
    return FailoverReport(
        throughput_before_tps=before, throughput_during_tps=during, throughput_after_tps=after,
        drop_fraction=max(0.0, 1 - during / before) if before > 0 else 1.0,
        lost_tokens=res.lost_tokens, wrong_tokens=res.wrong_tokens, tokens_done=res.tokens_done,
        failovers=client.stats.failovers, max_gap_in_window_s=max(window_gaps, default=0.0),
        median_gap_s=sorted(gaps)[len(gaps) // 2] if gaps else 0.0, max_abs_err=res.max_abs_err,
        killed_server=servers[0].server_id if res.events else None, config=asdict(cfg),
        server_tokens=dict(registry.server_tokens),
        per_second_tps=[res.throughput_tps(float(t), float(t + 1)) for t in range(int(end))],
        errors=res.errors,
    )
