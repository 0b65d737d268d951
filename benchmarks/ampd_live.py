"""AMPD live versus simulated: one GAIA-like workload through ``tokenomy sim`` and through
``tokenomy bench`` -> ``tokenomy serve`` (routing.mode ampd, disagg, colocated) -> ``tokenomy up``.

Every number both runs use comes from one :class:`LiveSpec` (the single source of truth); its
defaults are labelled choices that scale the 8-GPU GAIA study (docs/ampd-results.md) to what a
2-core machine drives live. They were picked in simulation (docs/ampd-live.md has the points
tried) as a point where AMPD has something to win:

* **cluster**: 3 Llama-3.1-8B / H100 instances (1 prefill + 2 decode for ampd and disagg, 3 mixed
  for colocated), ``gpu_memory_utilization`` 0.8 (memory is not what binds; at 0.3-0.5 AMPD's
  two decode instances run out of KV and lose to colocated's three). The decode pool chunks
  prefills at ``local_budget + max_num_seqs`` = 512 + 512 tokens, as the simulator's AMPD decode
  engines do; mixed instances at 8,192 (both runs' default). Every mode routes by session
  affinity (sim ``colocated`` is therefore the ``colocated-affinity`` variant; disagg picks decode
  instances by affinity in both runs).
* **no host KV tier** in the simulator's AMPD (``host_kv_bytes_per_gpu`` 0): the emulator has none,
  so a retention OFFLOAD is a drop in both runs (like for like).
* **workload**: GAIA's shape (shared 2.5k-token system prompt, ~3k-token tool results re-sent with
  the whole history every turn, ~12 turns) with shorter tool calls (mean 2 s instead of 8 s) and
  shorter answers (mean 150 tokens instead of 400), so that a session lasts about a minute;
  1.2 sessions/s for 40 s (42 sessions, 485 turns at seed 0).
* **SLO**: TTFT 2 s (the simulator's default), TPOT 25 ms (tighter than its 100 ms default: an
  interactive stream of 40 tokens/s). This is where AMPD's case is: colocated instances run each
  turn's ~3k-token incremental prefill in the same 8k-token step as their decodes and miss TPOT;
  AMPD's decode instances take a prefill locally only in 512-token chunks and only when the TPOT
  bound holds, else send it to the prefill instance. At 100 ms nothing misses TPOT here and
  colocated ties AMPD.

At this point the simulation gives AMPD 0.95 against 0.77 (colocated) and 0.59 (disagg); seeds 1
and 2 keep AMPD >= 0.2 ahead. Writes ``{"sim": {mode: attainment}, "live": {mode: attainment},
"diff", "sim_misses", "live_errors", "live_health", "spec"}``; ``live_health`` holds each mode's
wall time, the machine's load average before and after, each emulator's busy and lag-dropped
modelled seconds and KV counters, and why requests missed the SLO.

    python benchmarks/ampd_live.py --json out/ampd_live.json     # about 12 minutes
    python benchmarks/ampd_live.py --sim-only                    # seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _live import EngineShape, emulator_health, live_cluster, metric_lines, run_health, spec_json

from tokenomy.bench import BenchConfig, run_bench
from tokenomy.core import SLO, RequestRecord, Session
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.metrics.report import write_json
from tokenomy.metrics.summary import Summary
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.variants import make_variant
from tokenomy.workload.agentic import GAIA, AgentProfile, agent_sessions
from tokenomy.workload.arrivals import get_arrival
from tokenomy.workload.keys import StreamKeys

MODES = ("ampd", "disagg", "colocated")
SIM_VARIANT = {"ampd": "ampd", "disagg": "disagg", "colocated": "colocated-affinity"}
"""The simulator's variant of each live mode (all route by session affinity, as the gateway does)."""
ROUTER = "session_affinity"
HEALTH_INTERVAL_S = 0.5  # how often the gateway scrapes each engine's /metrics (its views' age)


@dataclass(frozen=True)
class LiveSpec(EngineShape):
    """The one description both runs are built from (module docstring: why these defaults)."""

    prefill: int = 1
    decode: int = 2
    local_budget_tokens: int = 512  # the simulator's AMPD default (SimConfig.ampd.placement_config)
    decode_max_num_seqs: int = 512
    rate_per_s: float = 1.2
    duration_s: float = 40.0
    seed: int = 0
    turns_mean: float = GAIA.turns.mean
    tool_latency_mean_s: float = 2.0
    output_mean_tokens: float = 150.0
    tool_result_mean_tokens: float = GAIA.tool_result_tokens.mean
    host_kv_bytes_per_gpu: float = 0.0  # the emulator has no host KV tier: none in sim either
    slo: SLO = field(default_factory=lambda: SLO(ttft_s=2.0, tpot_s=0.025))

    @property
    def instances(self) -> int:
        return self.prefill + self.decode

    def profile(self) -> AgentProfile:
        """GAIA with the scaled means; its tool-latency clip range scales with the mean."""
        k = self.tool_latency_mean_s / GAIA.think_time_s.mean
        think = dataclasses.replace(GAIA.think_time_s, mean=self.tool_latency_mean_s,
                                    low=min(GAIA.think_time_s.low, self.tool_latency_mean_s),
                                    high=GAIA.think_time_s.high * k)
        return dataclasses.replace(GAIA, name="gaia-scaled", think_time_s=think,
                                   turns=dataclasses.replace(GAIA.turns, mean=self.turns_mean),
                                   output_tokens=dataclasses.replace(GAIA.output_tokens, mean=self.output_mean_tokens),
                                   tool_result_tokens=dataclasses.replace(GAIA.tool_result_tokens,
                                                                          mean=self.tool_result_mean_tokens))

    def sessions(self) -> list[Session]:
        """Poisson arrivals and session shapes drawn as ``load_workload("gaia", ...)`` draws them."""
        arrival_rng, shape_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(self.seed).spawn(2))
        starts = get_arrival("poisson")(self.rate_per_s, self.duration_s, 1.0, arrival_rng)
        return agent_sessions(self.profile(), starts, shape_rng, StreamKeys(), id_prefix="gaia")

    def sim_config(self, mode: str) -> SimConfig:
        base = SimConfig(model=self.model, gpu=self.gpu, tp=self.tp, instances=self.instances,
                         prefill=self.prefill, decode=self.decode, decode_max_num_seqs=self.decode_max_num_seqs,
                         gpu_memory_utilization=self.gpu_memory_utilization, router=ROUTER, decode_router=ROUTER)
        cfg = make_variant(SIM_VARIANT[mode], base)
        placement = dataclasses.replace(cfg.ampd.placement_config, local_budget_tokens=self.local_budget_tokens)
        return dataclasses.replace(cfg, ampd=dataclasses.replace(cfg.ampd, placement_config=placement,
                                                                 host_kv_bytes_per_gpu=self.host_kv_bytes_per_gpu))

    def cluster_file(self, mode: str) -> dict[str, Any]:
        """``tokenomy up``'s cluster file for ``mode``."""
        if mode == "colocated":
            pools: list[dict[str, Any]] = [{"role": "mixed", "count": self.instances}]
        else:
            decode_engine = {"max_num_seqs": self.decode_max_num_seqs,
                             "max_num_batched_tokens": self.local_budget_tokens + self.decode_max_num_seqs}
            pools = [{"role": "prefill", "count": self.prefill},
                     {"role": "decode", "count": self.decode, "engine": decode_engine}]
        return self.up_file(pools)

    def instance_ids(self, mode: str) -> list[str]:
        if mode == "colocated":
            return [f"mixed-{i}" for i in range(self.instances)]
        return [f"prefill-{i}" for i in range(self.prefill)] + [f"decode-{i}" for i in range(self.decode)]

    def gateway_file(self, mode: str, urls: list[str], blocks: list[int], port: int, key: str,
                     tmp: Path) -> dict[str, Any]:
        """``tokenomy serve``'s config for ``mode`` over the instances at ``urls`` with ``blocks`` KV
        blocks each (so that binding and routing see the engines' real KV room, as the simulator does)."""
        return {
            "server": {"port": port},
            "backends": [{"id": i, "url": u, "role": i.split("-")[0], "models": [self.model], "total_blocks": b}
                         for i, u, b in zip(self.instance_ids(mode), urls, blocks, strict=True)],
            "health": {"interval_s": HEALTH_INTERVAL_S},
            "router": {"name": ROUTER},
            "routing": {"mode": mode, "slo": {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s},
                        "perf": {"model": self.model, "gpu": self.gpu, "tp": self.tp},
                        "ampd": {"local_budget_tokens": self.local_budget_tokens}},
            "ledger": {"url": f"sqlite:///{tmp}/ledger.db"},
            "ops": {"server_secret": "ampd-live-bench-0123", "reservations": "memory", "tenants": [
                {"org": "o", "teams": [{"name": "t", "keys": [{"name": "bench", "key": key}]}]}]},
        }


def misses(records: list[RequestRecord], summary: Summary, slo: SLO) -> dict[str, Any]:
    """Why requests missed the SLO (TTFT, TPOT, unfinished), with the latency percentiles."""
    out = {"requests": len(records), "ttft_miss": 0, "tpot_miss": 0, "unfinished": 0}
    for r in records:
        ttft = r.ttft_s
        if not r.finished or ttft is None or r.finish_s is None:
            out["unfinished"] += 1
            continue
        out["ttft_miss"] += ttft > slo.ttft_s
        if r.output_tokens > 1:
            out["tpot_miss"] += (r.finish_s - r.first_token_s) / (r.output_tokens - 1) > slo.tpot_s  # type: ignore[operator]
    for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s"):
        v = getattr(summary, k)
        out[k] = None if v is None else round(v, 3)
    return out


def simulated(spec: LiveSpec, sessions: list[Session], modes: list[str]) -> tuple[dict[str, float], dict[str, Any]]:
    """Each mode's simulated attainment, and its misses."""
    att, why = {}, {}
    for m in modes:
        res = simulate(sessions, spec.sim_config(m), spec.slo)
        att[m], why[m] = res.summary.slo_attainment, misses(res.records, res.summary, spec.slo)
    return att, why


def _gate_counts(gateway_url: str) -> dict[str, float]:
    """AMPD's live gates from the gateway's ``/metrics``, summed over backends: turns that had to
    wait in the prefill queues and in the decode admission gates, and decode admissions that
    overtook an older turn (empty outside ampd mode)."""
    out: dict[str, float] = {}
    for name, value in metric_lines(gateway_url):
        for prefix, gate, key in (("tokenomy_gateway_ampd_held_total{", "prefill", "prefill_held"),
                                  ("tokenomy_gateway_ampd_held_total{", "decode", "decode_held"),
                                  ("tokenomy_gateway_ampd_decode_reordered_total{", "", "decode_reordered")):
            if name.startswith(prefix) and (not gate or f'gate="{gate}"' in name):
                out[key] = out.get(key, 0.0) + value
    return out


def live_mode(mode: str, spec: LiveSpec, sessions: list[Session],
              api: str = "completions") -> tuple[float, dict[str, Any], dict[str, Any]]:
    """Attainment of ``mode`` live, the bench's errors, and the run's health (load, emulator lag,
    why requests missed)."""
    key = new_api_key()
    with run_health() as health, live_cluster(
            spec.cluster_file(mode), lambda urls, blocks, port, tmp: spec.gateway_file(mode, urls, blocks, port, key, tmp)
    ) as live:
        rep = run_bench(sessions, BenchConfig(targets=(live.url,), model=spec.model, api=api,
                                              api_key=key, slo=spec.slo, gpus=spec.instances * spec.tp,
                                              seed=spec.seed))
        health["gates"] = _gate_counts(live.url)
        health["emulators"] = emulator_health(spec.instance_ids(mode), live.instance_urls)
    health["misses"] = misses(rep.records, rep.summary, spec.slo)
    errors = {"by_status": rep.errors_by_status, "examples": rep.extras.get("error_examples", {})}
    if rep.errors_by_status:
        print(f"{mode}: errors {errors}", file=sys.stderr)
    return rep.summary.slo_attainment, errors, health


def main() -> int:
    d = LiveSpec()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=d.rate_per_s, help="sessions per second")
    ap.add_argument("--duration", type=float, default=d.duration_s, help="seconds of session arrivals")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--sim-only", action="store_true", help="only the simulation (seconds, no processes)")
    ap.add_argument("--api", default="completions", choices=["completions", "chat", "messages", "responses"],
                    help="the protocol the agent load speaks (messages/responses: agent-native traffic)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"ampd_live: --modes: unknown mode {bad[0]!r} (known: {', '.join(MODES)})", file=sys.stderr)
        return 2
    try:
        spec = dataclasses.replace(d, rate_per_s=args.rate, duration_s=args.duration, seed=args.seed)
        sessions = spec.sessions()
    except ValueError as exc:
        print(f"ampd_live: --rate/--duration: {exc}", file=sys.stderr)
        return 2
    if not sessions:
        print("ampd_live: the workload has no sessions: raise --rate or --duration", file=sys.stderr)
        return 2
    print(f"{spec.profile().name}: {len(sessions)} sessions, {sum(len(s.turns) for s in sessions)} turns", flush=True)
    sim, sim_misses = simulated(spec, sessions, modes)
    print(f"sim attainment: {sim}; {sim_misses}", flush=True)
    live: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    health: dict[str, Any] = {}
    for m in [] if args.sim_only else modes:
        live[m], errors[m], health[m] = live_mode(m, spec, sessions, args.api)
        print(f"live {m}: {live[m]:.3f} (sim {sim[m]:.3f}); {health[m]}", flush=True)
    out = {"sim": sim, "live": live, "diff": {m: live[m] - sim[m] for m in live},
           "sim_misses": sim_misses, "live_errors": errors, "live_health": health,
           "spec": spec_json(spec)}
    print(json.dumps(out))
    if args.json:
        print(f"wrote {write_json(args.json, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
