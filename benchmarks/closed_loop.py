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

``goodput_rps`` is SLO-meeting requests over one window common to the modes of a side: from 0 to
the latest last finish among them (each mode's own busy window would reward a run whose sessions
end sooner). ``attainment_by_tier`` counts every request offered, refusals as misses.

Simulated with ``tokenomy.sim`` (its admission gate), and live: ``run_bench`` (``tokenomy bench``,
each session with its tenant's key) -> ``tokenomy serve`` (the same policies in the gateway's
admission pool and router) -> ``tokenomy up`` (emulated engines). Every number of both runs comes
from one :class:`OverloadSpec`; its defaults are labelled choices that scale the study to what a
2-core machine drives live (2 emulated H100s, sessions of about a minute, 40 s of arrivals; the
same scaling as ``benchmarks/ampd_live.py``, whose GAIA profile this reuses).

Writes ``{"sim": {"blind": {...}, "closed": {...}}, "live": {...}, "diff": ..., "checks": ...,
"r90_rate": ..., "spec": ...}``; each ``{...}`` has ``attainment_by_tier``, ``goodput_rps``,
``attainment``, ``slo_met``, ``requests``, refusals, retries and deferrals by tier, TTFT/TPOT
P50/P99 by tier and every TTFT by tier (``ttft_s_by_tier``, to compare the distributions).

    python benchmarks/closed_loop.py --sim-only                   # seconds
    python benchmarks/closed_loop.py --sim-only --measure-r90     # and the 90% rate again
    python benchmarks/closed_loop.py --json out/closed_loop.json  # about 7 minutes on 2 cores
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

import numpy as np
from _live import EngineShape, spec_json
from ampd_live import LiveSpec

from tokenomy.core import SLO, RequestRecord, Session
from tokenomy.metrics import max_rate_at_attainment
from tokenomy.metrics.report import write_json
from tokenomy.metrics.summary import Summary
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


def figures(summary: Summary, records: list[RequestRecord]) -> dict[str, Any]:
    """What the benchmark reports of one run of ``records`` (``end_s``: its last finish, see
    ``common_goodput``; ``ttft_s_by_tier``: every TTFT, from the request's first attempt)."""
    tiers = summary.by_tier
    end_s = last_finish(records)
    pick = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")
    return {
        "attainment_by_tier": {t: round(g["attainment"], 4) for t, g in tiers.items()},
        "goodput_rps": None,
        "end_s": round(end_s, 2),
        "attainment": round(summary.slo_attainment, 4),
        "slo_met": summary.slo_met,
        "requests": summary.requests,
        "duration_s": round(summary.duration_s, 1),
        "refused_by_tier": {t: g["refused"] for t, g in tiers.items()},
        "retried_by_tier": {t: g.get("retried", 0) for t, g in tiers.items()},
        "deferred_by_tier": {t: g["deferred"] for t, g in tiers.items()},
        "latency_by_tier": {t: {k: None if g[k] is None else round(g[k], 3) for k in pick} for t, g in tiers.items()},
        "ttft_s_by_tier": ttfts_by_tier(records),
    }


def ttfts_by_tier(records: list[RequestRecord]) -> dict[str, list[float]]:
    """Every request's TTFT by tier (ms resolution, sorted): the live and simulated distributions."""
    out: dict[str, list[float]] = {}
    for r in records:
        if r.ttft_s is not None:
            out.setdefault(r.tier, []).append(round(r.ttft_s, 3))
    return {t: sorted(v) for t, v in sorted(out.items())}


def measure_r90(spec: OverloadSpec) -> tuple[float, dict[str, float]]:
    """Sessions/s at which the cluster, with no admission control, still meets the SLO for 90% of
    requests (interpolated over ``R90_RATES``)."""
    att = {r: simulate(spec.sessions(r), spec.sim_config(None), spec.slo).summary.slo_attainment for r in R90_RATES}
    return max_rate_at_attainment(list(att), list(att.values()), 0.9), att


def last_finish(records: list[RequestRecord]) -> float:
    return max((r.finish_s for r in records if r.finish_s is not None), default=0.0)


def common_goodput(side: dict[str, dict[str, Any]]) -> None:
    """Set each mode's ``goodput_rps``: SLO-met requests over ``[0, latest end_s of the side's
    MODES]`` (the modes run on both sides, so live and simulated goodput share a definition); a
    simulation-only mode counts over that window, or up to its own last finish if that is later."""
    window = max(f["end_s"] for m, f in side.items() if m in MODES)
    for f in side.values():
        w = max(window, f["end_s"])
        f["goodput_rps"] = round(f["slo_met"] / w, 4) if w > 0 else 0.0
        f["goodput_window_s"] = round(w, 2)


def simulated(spec: OverloadSpec, sessions: list[Session]) -> dict[str, Any]:
    out = {}
    for m in (*MODES, *SIM_ONLY_MODES):
        res = simulate(sessions, spec.sim_config(m), spec.slo)
        out[m] = figures(res.summary, res.records)
    common_goodput(out)
    return out


def seed_spread(spec: OverloadSpec, rate: float, seeds: list[int]) -> dict[str, Any]:
    """Per seed: the closed loop's top- and lowest-tier attainment and its goodput over the blind run's."""
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


def jitter_spread(spec: OverloadSpec, sessions: list[Session], draws: int, max_shift_s: float = 0.01) -> dict[str, Any]:
    """The simulator's own run-to-run spread: each mode's figures over ``draws`` copies of the
    workload whose session starts are shifted by up to ``max_shift_s`` (uniform, seeded per draw),
    as ``{mode: {figure: [min, max]}}`` with every draw's figures. A live run is one such draw:
    which turn meets a deadline, and so which session is abandoned, turns on milliseconds."""
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for k in range(draws):
        rng = np.random.default_rng([spec.seed, k])
        shifted = [dataclasses.replace(s, start_s=s.start_s + float(rng.uniform(0, max_shift_s))) for s in sessions]
        side = {m: figures(*_sim(spec, shifted, m)) for m in MODES}
        common_goodput(side)
        for m, f in side.items():
            runs[m].append({**{f"attainment.{t}": a for t, a in f["attainment_by_tier"].items()},
                            "goodput_rps": f["goodput_rps"], "slo_met": f["slo_met"], "requests": f["requests"]})
    out: dict[str, Any] = {"draws": draws, "max_shift_s": max_shift_s}
    for m, rows in runs.items():
        out[m] = {k: [min(r[k] for r in rows), max(r[k] for r in rows)] for k in rows[0]}
        out[m]["by_draw"] = rows
    return out


def _sim(spec: OverloadSpec, sessions: list[Session], mode: str) -> tuple[Summary, list[RequestRecord]]:
    res = simulate(sessions, spec.sim_config(mode), spec.slo)
    return res.summary, res.records


def checks(out: dict[str, Any]) -> dict[str, Any]:
    """The Done-when lines, each with the figures it compares."""
    res: dict[str, Any] = {}
    for side in ("sim", "live"):
        if side not in out:
            continue
        blind, closed = out[side]["blind"], out[side]["closed"]
        gold = closed["attainment_by_tier"].get("gold", 0.0)
        ratio = closed["goodput_rps"] / blind["goodput_rps"] if blind["goodput_rps"] else None
        res[side] = {"gold_attainment": gold, "gold_ok": gold >= 0.95, "goodput_ratio": ratio,
                     "goodput_ok": ratio is not None and ratio >= 0.95,
                     "lowest_tier_attainment": closed["attainment_by_tier"].get("free", 0.0)}
    if "live" in out:
        gaps = {}
        for m in MODES:
            s, lv = out["sim"][m], out["live"][m]
            for t, a in s["attainment_by_tier"].items():
                gaps[f"{m}.attainment.{t}"] = round(lv["attainment_by_tier"].get(t, 0.0) - a, 4)
            gaps[f"{m}.goodput_rel"] = round(lv["goodput_rps"] / s["goodput_rps"] - 1, 4) if s["goodput_rps"] else None
        res["live_minus_sim"] = gaps
        res["within_0.08"] = all(v is not None and abs(v) <= 0.08 for v in gaps.values())
        if "sim_jitter" in out:
            res.update(against_spread(out["live"], out["sim_jitter"]))
    return res


def against_spread(live: dict[str, Any], jitter: dict[str, Any]) -> dict[str, Any]:
    """Each live figure against the simulator's own spread (``jitter_spread``): its gap to the mean
    of the jittered draws (goodput relative), and whether it lies within their [min, max]."""
    gaps, inside = {}, {}
    for m in MODES:
        rows, lv = jitter[m]["by_draw"], live[m]
        figs = {f"attainment.{t}": a for t, a in lv["attainment_by_tier"].items()} | {"goodput_rps": lv["goodput_rps"]}
        for k, v in figs.items():
            mean = sum(r[k] for r in rows) / len(rows)
            key = f"{m}.goodput_rel" if k == "goodput_rps" else f"{m}.{k}"
            gaps[key] = round(v / mean - 1 if k == "goodput_rps" else v - mean, 4)
            inside[key] = jitter[m][k][0] <= v <= jitter[m][k][1]
    return {"live_minus_sim_mean": gaps, "within_0.08_of_sim_mean": all(abs(v) <= 0.08 for v in gaps.values()),
            "inside_sim_spread": inside}


def brief(figs: dict[str, Any]) -> dict[str, Any]:
    """``figs`` (one mode's or a side's) without the TTFT samples, for printing."""
    if "ttft_s_by_tier" in figs:
        return {k: v for k, v in figs.items() if k != "ttft_s_by_tier"}
    return {k: brief(v) if isinstance(v, dict) else v for k, v in figs.items()}


def main() -> int:
    d = OverloadSpec()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=None, help="offered sessions/s (default: overload x r90)")
    ap.add_argument("--measure-r90", action="store_true",
                    help=f"measure the 90%% rate by simulation (default: the spec's {d.r90_rate} sessions/s)")
    ap.add_argument("--duration", type=float, default=d.duration_s, help="seconds of session arrivals")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--max-in-flight", type=int, default=d.max_in_flight)
    ap.add_argument("--sim-only", action="store_true", help="only the simulation (seconds, no processes)")
    ap.add_argument("--sim-seeds", default="0,1,2,3",
                    help="also simulate these seeds (the run-to-run spread of one short run; '' for none)")
    ap.add_argument("--sim-jitter", type=int, default=0, metavar="N",
                    help="also simulate N copies with session starts shifted by up to 10 ms: the simulator's "
                         "own run-to-run spread, against which the live-minus-sim gaps are read")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    try:
        spec = dataclasses.replace(d, duration_s=args.duration, seed=args.seed, max_in_flight=args.max_in_flight)
        r90, curve = measure_r90(spec) if args.measure_r90 else (spec.r90_rate, {})
        rate = args.rate if args.rate is not None else spec.overload * r90
        sessions = spec.sessions(rate)
    except ValueError as exc:
        print(f"closed_loop: {exc}", file=sys.stderr)
        return 2
    if not sessions:
        print("closed_loop: the workload has no sessions: raise --rate or --duration", file=sys.stderr)
        return 2
    print(f"r90 {r90:.3f} sessions/s {curve}; offered {rate:.3f} sessions/s: {len(sessions)} sessions, "
          f"{sum(len(s.turns) for s in sessions)} turns", flush=True)
    out: dict[str, Any] = {"r90_rate": r90, "r90_curve": curve, "rate_per_s": rate,
                           "sim": simulated(spec, sessions)}
    print(f"sim: {json.dumps(brief(out['sim']))}", flush=True)
    seeds = [int(x) for x in args.sim_seeds.split(",") if x.strip()]
    if seeds:
        out["sim_seeds"] = seed_spread(spec, rate, seeds)
        print(f"sim seeds: {json.dumps(out['sim_seeds'])}", flush=True)
    if args.sim_jitter > 0:
        out["sim_jitter"] = jitter_spread(spec, sessions, args.sim_jitter)
        print(f"sim jitter: {json.dumps({m: {k: v for k, v in f.items() if k != 'by_draw'} for m, f in out['sim_jitter'].items() if isinstance(f, dict)})}", flush=True)
    if not args.sim_only:
        from closed_loop_live import live_mode

        out["live"], out["live_health"] = {}, {}
        for m in MODES:
            out["live"][m], out["live_health"][m] = live_mode(m, spec, sessions)
            print(f"live {m}: {json.dumps(brief(out['live'][m]))}; load {out['live_health'][m]['loadavg']}", flush=True)
        common_goodput(out["live"])
    out["checks"] = checks(out)
    out["spec"] = spec_json(spec)
    out["loadavg_end"] = os.getloadavg()
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out["checks"], indent=2))
    if args.json:
        print(f"wrote {write_json(args.json, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
