"""Dual-batch overlap experiment behind ``benchmarks/eaas_overlap.py``.

The same ``n_layers`` stack runs serially (one batch: compute, then wait for the experts) and
overlapped (two halves ping-ponged) as ``iterations`` back-to-back *pairs*, the order inside a pair
alternating, so drifting background load hits both alike. Exposed communication of one forward = its
wall time - the client's own compute time in it (``ClientStats.local_compute_s``). Per pair,
``hidden = 1 - exposed_overlap / exposed_serial``; ``hidden_fraction`` is the median over pairs,
reported with its p10, p90, min and max. The per-mode medians stay beside it.
A round trip is injected in the transport (``rtt_delay_s``), standing in for a cross-machine network.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tokenomy.eaas.balance import naive_placement
from tokenomy.eaas.client import AttentionClient
from tokenomy.eaas.config import preset
from tokenomy.eaas.launcher import start_servers, stop_all
from tokenomy.eaas.layers import LocalMixer, reference_stack
from tokenomy.eaas.moe import MoEWeights
from tokenomy.eaas.registry import Registry, RoutingTable
from tokenomy.eaas.stats import quantile
from tokenomy.eaas.transport import ZmqTransport


@dataclass(frozen=True)
class OverlapConfig:
    rtt_delay_s: float = 0.005
    n_servers: int = 1   # on a 2-core machine more server processes preempt the client (see docs)
    n_layers: int = 8
    batch_tokens: int = 256
    mixer_width: int = 4096   # sets the client's local compute per layer (~ the round trip per half)
    iterations: int = 15
    preset: str = "deepseek-tiny"
    seed: int = 0


@dataclass
class OverlapReport:
    exposed_comm_s_serial: float
    exposed_comm_s_overlap: float
    hidden_fraction: float          # median over pairs of 1 - exposed_overlap / exposed_serial
    hidden_fraction_p10: float
    hidden_fraction_p90: float
    hidden_fraction_min: float
    hidden_fraction_max: float
    pairs: int
    wall_s_serial: float
    wall_s_overlap: float
    compute_s_serial: float
    compute_s_overlap: float
    client_cpu_s_serial: float   # process CPU time: a contention-proof cross-check of compute_s
    client_cpu_s_overlap: float
    max_abs_err: float
    config: dict[str, Any]
    per_pair_hidden: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _once(client: AttentionClient, x: torch.Tensor, mixer: LocalMixer, n_layers: int,
          overlap: bool) -> tuple[float, float, float, torch.Tensor]:
    c0, t0, p0 = client.stats.local_compute_s, time.perf_counter(), time.process_time()
    y = client.forward_layers(x, n_layers, mixer, overlap)
    return time.perf_counter() - t0, client.stats.local_compute_s - c0, time.process_time() - p0, y


def _measure(client: AttentionClient, x: torch.Tensor, mixer: LocalMixer,
             cfg: OverlapConfig) -> tuple[dict[bool, list[tuple[float, float, float]]], dict[bool, torch.Tensor]]:
    """``cfg.iterations`` pairs of a serial and an overlapped forward, back to back, the order
    alternating from pair to pair; sample i of both modes belongs to pair i."""
    for overlap in (False, True):  # warm-up: connections, allocator
        _once(client, x, mixer, cfg.n_layers, overlap)
    samples: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    outputs: dict[bool, torch.Tensor] = {}
    for i in range(cfg.iterations):
        for overlap in ((False, True) if i % 2 == 0 else (True, False)):
            wall, comp, cpu, outputs[overlap] = _once(client, x, mixer, cfg.n_layers, overlap)
            samples[overlap].append((wall, comp, cpu))
    return samples, outputs


def _median(values: list[float]) -> float:
    return quantile(values, 0.5)


def run_overlap(cfg: OverlapConfig) -> OverlapReport:
    """Measure serial vs dual-batch exposed communication; servers are stopped before returning."""
    torch.set_num_threads(1)
    model = preset(cfg.preset)
    weights = MoEWeights.from_seed(model, cfg.seed)
    mixer = LocalMixer.from_seed(model.hidden, cfg.mixer_width, cfg.seed)
    x = torch.randn(cfg.batch_tokens, model.hidden, generator=torch.Generator().manual_seed(cfg.seed))
    ids = [f"s{i}" for i in range(cfg.n_servers)]
    servers = start_servers(naive_placement(model.n_experts, ids), preset=cfg.preset, seed=cfg.seed)
    try:
        registry = Registry()
        for s in servers:
            registry.register(s.server_id, s.address, s.expert_ids)
        client = AttentionClient(weights, RoutingTable(registry), ZmqTransport(rtt_delay_s=cfg.rtt_delay_s),
                                 timeout_s=max(1.0, 20 * cfg.rtt_delay_s))
        try:
            samples, outputs = _measure(client, x, mixer, cfg)
        finally:
            client.close()
    finally:
        stop_all(servers)
    ref = reference_stack(weights, mixer, x, cfg.n_layers)
    err = max(float((y - ref).abs().max()) for y in outputs.values())
    exposed = {mode: _median([max(0.0, w - c) for w, c, _ in samples[mode]]) for mode in (False, True)}
    wall_s, wall_o = (_median([w for w, _, _ in samples[m]]) for m in (False, True))
    comp_s, comp_o = (_median([c for _, c, _ in samples[m]]) for m in (False, True))
    cpu_s, cpu_o = (_median([p for _, _, p in samples[m]]) for m in (False, True))
    exp_s, exp_o = exposed[False], exposed[True]
    hidden = [1 - max(0.0, wo - co) / max(1e-9, ws - cs)
              for (ws, cs, _), (wo, co, _) in zip(samples[False], samples[True], strict=True)]
    return OverlapReport(
        exposed_comm_s_serial=exp_s, exposed_comm_s_overlap=exp_o,
        hidden_fraction=quantile(hidden, 0.5), hidden_fraction_p10=quantile(hidden, 0.1),
        hidden_fraction_p90=quantile(hidden, 0.9), hidden_fraction_min=min(hidden),
        hidden_fraction_max=max(hidden), pairs=len(hidden), per_pair_hidden=hidden,
        wall_s_serial=wall_s, wall_s_overlap=wall_o, compute_s_serial=comp_s, compute_s_overlap=comp_o,
        client_cpu_s_serial=cpu_s, client_cpu_s_overlap=cpu_o,
        max_abs_err=err, config=asdict(cfg),
    )
