"""The closed loop under overload, simulated and live: tenant-blind admission versus the closed loop.

GAIA-like agents of three tiers (gold 20%, silver 30%, free 50% of the sessions) offer about twice
the load the cluster serves at 90% SLO attainment. Both runs put the same front door in front of
the cluster, capped at ``max_in_flight`` requests:

* **blind**: ``fifo`` admission (first come, first served, shed after ``blind_max_defer_s``) and
  the ``session_affinity`` router: what the gateway does when it does not look at who asks;
* **closed**: ``tier_wfq`` admission (weighted fair queueing across tiers, deferral before
  shedding, budget and rate pacing, a tenant's retries behind its first attempts) and the same router. The simulation also runs
  **closed_routing_bias**: ``tier_wfq`` with the ``tier_aware`` router over ``session_affinity``
  (docs/closed-loop.md: at this point it cost the top tier attainment, so the live run leaves it out).

Clients retry a refused turn as agent SDKs do (``RetryPolicy``: after the ``retry-after`` the
admission gave, at most ``max_retries`` times, then the session is abandoned), in both runs: the
simulator's admission gate and ``tokenomy bench`` apply the same rule. A retried turn is one
request whose TTFT counts from its first attempt (docs/closed-loop.md, "Retries").

The study runs on a fleet of ``cells`` independent cells (each 2 instances behind its own gateway,
cell ``i`` with workload seed ``seed + i``), pooled. ``goodput_rps`` is SLO-met requests finished
within a fixed window ``[0, goodput_window_s]`` over it; the earlier window (0 to the latest last
finish of a cell's modes) is kept as ``goodput_rps_last_finish``. ``attainment_by_tier`` counts
every request offered, refusals as misses. The simulated side ``sim`` is each figure's mean over
``draws`` jittered simulations, with its spread (``closed_loop_stats``: why).

Simulated with ``tokenomy.sim`` (its admission gate), and live: ``run_bench`` (``tokenomy bench``,
each session with its tenant's key) -> ``tokenomy serve`` (the same policies in the gateway's
admission pool and router) -> ``tokenomy up`` (emulated engines). Every number of both runs comes
from one :class:`OverloadSpec`; its defaults are labelled choices that scale the study to what a
2-core machine drives live (2 emulated H100s, sessions of about a minute, 40 s of arrivals; the
same scaling as ``benchmarks/ampd_live.py``, whose GAIA profile this reuses).

Writes ``{"sim": {"blind": {...}, "closed": {...}}, "live": {...}, "checks": ..., "sim_single": ...,
"sim_draws": ..., "live_health": ..., "r90_rate": ..., "spec": ...}``; each ``{...}`` has
``attainment_by_tier`` and ``goodput_rps`` (live: also ``attainment``, ``slo_met``, ``requests``,
refusals, retries and deferrals by tier, TTFT P50/P99 by tier, every TTFT by tier and each cell's
figures; sim: also each figure's ``spread`` over the draws).

    nice -n 19 python benchmarks/closed_loop.py --sim-only --json out/sim.json   # 1-3 minutes
    python benchmarks/closed_loop.py --sim-only --cells 1 --measure-r90          # the 90% rate again
    python benchmarks/closed_loop.py --sim-from out/sim.json --lock LOCK --json out/live.json  # ~9 minutes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _fidelity import JITTER_S, jittered_starts
from _live import EngineShape, spec_json
from ampd_live import LiveSpec
from closed_loop_stats import (
    common_goodput,
    draws_mean,
    figures,
    flat,
    gaps,
    inside_spread,
    per_draw_checks,
    pool,
    side_checks,
    within,
)

from tokenomy.core import SLO, Session
from tokenomy.metrics import max_rate_at_attainment
from tokenomy.metrics.report import write_json
from tokenomy.policy.closedloop import RetryPolicy
from tokenomy.sim import SimConfig, simulate
from tokenomy.sim.admission_options import AdmissionOptions
from tokenomy.workload.tenants import TenantMix, assign_tenants

MODES = {"blind": ("fifo", "session_affinity"), "closed": ("tier_wfq", "session_affinity")}
"""Each mode's (admission policy, router); the same registry entries run in sim and gateway."""
SIM_ONLY_MODES = {"closed_routing_bias": ("tier_wfq", "tier_aware")}
BASE_ROUTER = "session_affinity"
TIER_PRIORITY = {"gold": 20, "silver": 10, "free": 0}
"""The gateway knows a key's tier by its priority in the key tree (``ops.admission.tiers``)."""
R90_RATES = (1.0, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8)
LOCK_GAP_S = 5.0
"""Seconds between the live modes with the lock free: a blocked waiter is woken on release, but a
process that takes the lock again at once wins the race."""


@dataclass(frozen=True)
class OverloadSpec(EngineShape):
    """The one description both runs are built from (module docstring: why these defaults)."""

    instances: int = 2
    tenants: str = "gold:0.2,silver:0.3,free:0.5"
    overload: float = 2.0  # offered load / the rate served at 90% attainment without admission
    # sessions/s at 90% attainment without admission, as measure_r90 found it (2026-12-01, seed 0);
    # --measure-r90 measures it again
    r90_rate: float = 1.466
    duration_s: float = 40.0
    seed: int = 0
    max_in_flight: int = 24  # labelled default: 12 a 2-H100 instance, picked in simulation (docs)
    # the fleet: `cells` independent copies of the study (its own gateway, engines and workload seed
    # seed + i), pooled: twice the sample of one cell at the load and cap the policies were picked at
    cells: int = 2
    draws: int = 20  # simulated draws whose mean is the simulated figure (fixed before any live run)
    # goodput's fixed window: past every last finish of the 20 simulated draws of both cells
    # (seed 0: 171-243 s, seed 1: 163-330 s)
    goodput_window_s: float = 360.0
    retry_after_s: int = 1  # what a shed request is told to wait (the gateway's default)
    max_retries: int = RetryPolicy.max_retries  # how often clients send a refused turn again (the OpenAI SDK's)
    slo: SLO = field(default_factory=lambda: SLO(ttft_s=2.0, tpot_s=0.1))

    def live_spec(self, rate: float) -> LiveSpec:
        """ampd_live's GAIA-like profile (tool calls of mean 2 s, answers of mean 150 tokens)."""
        return dataclasses.replace(LiveSpec(), model=self.model, gpu=self.gpu, rate_per_s=rate,
                                   duration_s=self.duration_s, seed=self.seed, tool_latency_mean_s=2.0,
                                   output_mean_tokens=150.0)

    @property
    def rate_per_s(self) -> float:
        """The offered load: ``overload`` x the 90%-attainment rate."""
        return self.overload * self.r90_rate

    def sessions(self, rate: float) -> list[Session]:
        return assign_tenants(self.live_spec(rate).sessions(), TenantMix.parse(self.tenants), self.seed)

    def sim_config(self, mode: str | None) -> SimConfig:
        policy, router = (None, BASE_ROUTER) if mode is None else {**MODES, **SIM_ONLY_MODES}[mode]
        admission = None if policy is None else AdmissionOptions(policy, self.max_in_flight,
                                                                 retry_after_s=self.retry_after_s, retry=self.retry)
        return SimConfig(model=self.model, gpu=self.gpu, instances=self.instances,
                         gpu_memory_utilization=self.gpu_memory_utilization, router=router, admission=admission)

    @property
    def retry(self) -> RetryPolicy:
        """The clients' retries of a refused turn, in both runs."""
        return RetryPolicy(max_retries=self.max_retries)

    def cluster_file(self) -> dict[str, Any]:
        return self.up_file([{"role": "mixed", "count": self.instances}])

    def gateway_file(self, mode: str, urls: list[str], blocks: list[int], port: int, keys: dict[str, str],
                     tmp: Path) -> dict[str, Any]:
        """``tokenomy serve``'s config: one org per tier, its key's priority naming the tier."""
        policy, router = MODES[mode]
        options = {"base": BASE_ROUTER} if router == "tier_aware" else {}
        tenants = [{"org": t, "limits": {"priority": TIER_PRIORITY[t]},
                    "teams": [{"name": t, "keys": [{"name": t, "key": k}]}]} for t, k in keys.items()]
        return {
            "server": {"port": port},
            "backends": [{"id": f"mixed-{i}", "url": u, "role": "mixed", "models": [self.model], "total_blocks": b}
                         for i, (u, b) in enumerate(zip(urls, blocks, strict=True))],
            "health": {"interval_s": 0.5},
            "router": {"name": router, "options": options},
            "ledger": {"url": f"sqlite:///{tmp}/ledger.db"},
            "ops": {"server_secret": "closed-loop-bench-0123", "reservations": "memory", "tenants": tenants,
                    "admission": {"max_in_flight": self.max_in_flight, "retry_after_s": self.retry_after_s,
                                  "closed_loop": {
                        "policy": policy, "tiers": [{"name": t, "min_priority": p} for t, p in TIER_PRIORITY.items()]}}},
        }


def cell_specs(spec: OverloadSpec) -> list[OverloadSpec]:
    """The fleet's cells: each the whole study on ``instances`` instances behind its own gateway,
    cell ``i`` with workload seed ``seed + i``."""
    return [dataclasses.replace(spec, seed=spec.seed + i, cells=1) for i in range(spec.cells)]


def measure_r90(spec: OverloadSpec) -> tuple[float, dict[str, float]]:
    """Sessions/s at which one cell, with no admission control, still meets the SLO for 90% of
    requests (interpolated over ``R90_RATES``)."""
    att = {r: simulate(spec.sessions(r), spec.sim_config(None), spec.slo).summary.slo_attainment for r in R90_RATES}
    return max_rate_at_attainment(list(att), list(att.values()), 0.9), att


def _sim(spec: OverloadSpec, sessions: list[Session], mode: str) -> dict[str, Any]:
    res = simulate(sessions, spec.sim_config(mode), spec.slo)
    return figures(res.summary, res.records, spec.slo, spec.goodput_window_s)


def simulated(spec: OverloadSpec, sessions: list[Session]) -> dict[str, Any]:
    """One cell, one simulation of ``sessions``, every mode (the simulation-only ones too)."""
    out = {m: _sim(spec, sessions, m) for m in (*MODES, *SIM_ONLY_MODES)}
    common_goodput(out, list(MODES))
    return out


def jittered(spec: OverloadSpec, sessions: list[Session], k: int, max_shift_s: float = JITTER_S) -> list[Session]:
    """Draw ``k`` of the workload: each session's start shifted by up to ``max_shift_s`` (uniform,
    seeded by the cell's seed and ``k``). A live run is one such draw: which turn meets a deadline,
    and so which session is abandoned, turns on milliseconds."""
    return jittered_starts(sessions, [spec.seed, k], max_shift_s)


def simulated_fleet(spec: OverloadSpec, rate: float, draws: int) -> dict[str, Any]:
    """``sim``: each mode's figures as the mean over ``draws`` jittered draws of the fleet (every
    cell jittered, the cells pooled per draw), with their spread; ``sim_single``: the fleet
    simulated once unjittered (the earlier single simulated figure, and the simulation-only
    modes); ``sim_draws``: every draw's figures."""
    cells = [(c, c.sessions(rate)) for c in cell_specs(spec)]
    once = [simulated(c, s) for c, s in cells]
    single = {m: pool([side[m] for side in once]) for m in (*MODES, *SIM_ONLY_MODES)}
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for k in range(draws):
        per_cell = [{m: _sim(c, jittered(c, s, k), m) for m in MODES} for c, s in cells]
        for side in per_cell:
            common_goodput(side, list(MODES))
        for m in MODES:
            f = pool([side[m] for side in per_cell])
            rows[m].append(flat(f))
    return {"sim": {m: draws_mean(r) for m, r in rows.items()}, "sim_single": single,
            "sim_draws": {"draws": draws, "max_shift_s": JITTER_S, **rows}}


def seed_spread(spec: OverloadSpec, rate: float, seeds: list[int]) -> dict[str, Any]:
    """Per seed (one cell each): the closed loop's top- and lowest-tier attainment and its goodput
    over the blind run's."""
    rows = {}
    for seed in seeds:
        s = dataclasses.replace(spec, seed=seed)
        sim = simulated(s, s.sessions(rate))
        b, c = sim["blind"], sim["closed"]
        rows[seed] = {"gold": c["attainment_by_tier"].get("gold"), "free": c["attainment_by_tier"].get("free"),
                      "blind_gold": b["attainment_by_tier"].get("gold"),
                      "goodput_ratio": round(c["goodput_rps"] / b["goodput_rps"], 4) if b["goodput_rps"] else None}
    ratios = [r["goodput_ratio"] for r in rows.values() if r["goodput_ratio"] is not None]
    return {"by_seed": rows, "mean_goodput_ratio": round(sum(ratios) / len(ratios), 4) if ratios else None,
            "min_gold": min(r["gold"] or 0.0 for r in rows.values())}


def checks(out: dict[str, Any]) -> dict[str, Any]:
    """The Done-when lines, each with the figures it compares. The simulated figure is the mean of
    the draws (``sim``); the checks against the single unjittered simulation and with the earlier
    last-finish goodput window are kept beside it."""
    modes = list(MODES)
    res: dict[str, Any] = {"sim": side_checks(out["sim"]["blind"], out["sim"]["closed"]),
                           "sim_single": side_checks(out["sim_single"]["blind"], out["sim_single"]["closed"]),
                           "sim_draws": per_draw_checks(out["sim_draws"])}
    if "live" in out:
        live = out["live"]
        res["live"] = side_checks(live["blind"], live["closed"])
        res["live_minus_sim"] = gaps(live, out["sim"], modes, "goodput_rps")
        res["within_0.08"] = within(res["live_minus_sim"])
        res["inside_sim_spread"] = inside_spread(live, out["sim"], modes)
        old = {"live_minus_sim_single_last_finish": gaps(live, out["sim_single"], modes, "goodput_rps_last_finish"),
               "live_minus_sim_mean_last_finish": gaps(live, out["sim"], modes, "goodput_rps_last_finish"),
               "live_minus_sim_single": gaps(live, out["sim_single"], modes, "goodput_rps")}
        res["earlier_definitions"] = {**old, **{f"within_0.08.{k}": within(v) for k, v in old.items()}}
    return res


def brief(figs: dict[str, Any]) -> dict[str, Any]:
    """``figs`` (one mode's or a side's) without the TTFT samples and the cells, for printing."""
    if "attainment_by_tier" in figs:
        return {k: v for k, v in figs.items() if k not in ("ttft_s_by_tier", "cells", "spread")}
    return {k: brief(v) if isinstance(v, dict) else v for k, v in figs.items()}


def main() -> int:
    d = OverloadSpec()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=None, help="offered sessions/s per cell (default: overload x r90)")
    ap.add_argument("--measure-r90", action="store_true",
                    help=f"measure the 90%% rate by simulation (default: the spec's {d.r90_rate} sessions/s)")
    ap.add_argument("--duration", type=float, default=d.duration_s, help="seconds of session arrivals")
    ap.add_argument("--seed", type=int, default=d.seed, help="cell i's workload seed is SEED + i")
    ap.add_argument("--cells", type=int, default=d.cells, help="independent cells of the fleet, pooled")
    ap.add_argument("--draws", type=int, default=d.draws,
                    help="jittered simulations whose mean is the simulated figure (the simulator's spread)")
    ap.add_argument("--max-in-flight", type=int, default=d.max_in_flight)
    ap.add_argument("--sim-only", action="store_true", help="only the simulation (no processes)")
    ap.add_argument("--sim-from", type=Path, default=None,
                    help="take the simulated side from this JSON of an earlier run of the same spec "
                         "(simulate once under nice, then run live without simulating)")
    ap.add_argument("--lock", type=Path, default=None,
                    help="hold this flock around each live mode only (a quiet machine for the measurement)")
    ap.add_argument("--sim-seeds", default="",
                    help="also simulate these seeds, one cell each (the spread over workloads; '' for none)")
    ap.add_argument("--api", default="completions", choices=["completions", "chat", "messages", "responses"],
                    help="the protocol the live agent load speaks (messages/responses: agent-native traffic)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    try:
        spec = dataclasses.replace(d, duration_s=args.duration, seed=args.seed, max_in_flight=args.max_in_flight,
                                   cells=args.cells, draws=args.draws)
        r90, curve = measure_r90(spec) if args.measure_r90 else (spec.r90_rate, {})
        rate = args.rate if args.rate is not None else spec.overload * r90
        cells = [(c, c.sessions(rate)) for c in cell_specs(spec)]
    except ValueError as exc:
        print(f"closed_loop: {exc}", file=sys.stderr)
        return 2
    if spec.cells < 1 or spec.draws < 1 or not all(s for _, s in cells):
        print("closed_loop: need --cells >= 1, --draws >= 1 and sessions in every cell (raise --rate or "
              "--duration)", file=sys.stderr)
        return 2
    print(f"r90 {r90:.3f} sessions/s {curve}; offered {rate:.3f} sessions/s per cell, {spec.cells} cells: "
          f"{sum(len(s) for _, s in cells)} sessions, {sum(len(x.turns) for _, s in cells for x in s)} turns",
          flush=True)
    out: dict[str, Any] = {"r90_rate": r90, "r90_curve": curve, "rate_per_s": rate, "spec": spec_json(spec)}
    if args.sim_from is not None:
        earlier = json.loads(args.sim_from.read_text())
        if earlier.get("spec") != json.loads(json.dumps(out["spec"])) or earlier.get("rate_per_s") != rate:
            print(f"closed_loop: {args.sim_from} was simulated with another spec or rate", file=sys.stderr)
            return 2
        out.update({k: earlier[k] for k in ("sim", "sim_single", "sim_draws")})
        out["sim_from"] = str(args.sim_from)
    else:
        out.update(simulated_fleet(spec, rate, spec.draws))
    print(f"sim (mean of {spec.draws} draws): {json.dumps(brief(out['sim']))}", flush=True)
    seeds = [int(x) for x in args.sim_seeds.split(",") if x.strip()]
    if seeds:
        out["sim_seeds"] = seed_spread(dataclasses.replace(spec, cells=1), rate, seeds)
        print(f"sim seeds: {json.dumps(out['sim_seeds'])}", flush=True)
    if not args.sim_only:
        from closed_loop_live import live_fleet

        out["live"], out["live_health"] = {}, {}
        for i, m in enumerate(MODES):
            if i and args.lock is not None:
                time.sleep(LOCK_GAP_S)  # let a waiter take the lock between the modes
            out["live"][m], out["live_health"][m] = live_fleet(m, cells, args.lock, args.api)
            print(f"live {m}: {json.dumps(brief(out['live'][m]))}; load {out['live_health'][m]['loadavg']}", flush=True)
        for i in range(spec.cells):
            common_goodput({m: out["live"][m]["cells"][i] for m in MODES}, list(MODES))
        for m in MODES:
            out["live"][m]["goodput_rps_last_finish"] = round(sum(c["goodput_rps_last_finish"]
                                                                  for c in out["live"][m]["cells"]), 4)
    out["checks"] = checks(out)
    out["loadavg_end"] = os.getloadavg()
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out["checks"], indent=2))
    if args.json:
        print(f"wrote {write_json(args.json, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
