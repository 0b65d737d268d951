"""AMPD where its mechanism binds: a grid of operating points.

Each point compares AMPD (best of its splits), ``disagg-offload`` (best of its splits),
``colocated-offload`` and ``colocated`` over 4-6 session rates, all on the same GPUs, and
reports AMPD against the best of the other three:

* ``band_ratio``: AMPD's attainment over the best other's, averaged over the rates where the
  best other attains 30-70% (None when no rate falls in that band);
* ``goodput_ratio``: DistServe goodput (highest rate with >= 90% attainment, interpolated);
* ``p99_ttft_no_worse``: at every rate where AMPD attains >= 90%, its P99 TTFT <= the best other's
  (the best other at that rate, by attainment; seed 0 only, all turns);
* the tail rule, ``p99_ttft_tpot_met_no_worse``: at every rate where AMPD attains >= 90% (seed 0),
  AMPD's P99 TTFT among the turns that met their TPOT SLO (``Summary.ttft_p99_tpot_met_s``), median
  over workload seeds 0, 1, 2, is <= that of the best other deployment at that rate (by seed-0
  attainment, the same shape), median over the same seeds. A deployment that spends TPOT to shorten
  its TTFT tail is judged on the turns it still serves within TPOT. ``p99_ttft_tpot_met`` gives
  each kind's seed-0 value per rate, and ``tail_rule`` every seed's value of the two compared;
* the shape: every split (and TP shape of the inventory, ``alt_gpus``) of a kind runs at every
  rate, and the kind's best curve (``Curve.score``: goodput, then mean attainment) stands for it;
* the planner's choice (``tokenomy.experiment.choose``: every candidate simulated at the point's
  planning rate on an independent sample, seed + 1), its predicted goodput there, and
  ``planner_goodput_ratio``: the chosen deployment's grid goodput over the best found.

Points (SLO TTFT / TPOT; TTFT bounds and rates are ours, docs/ampd-results.md):

  a  GAIA-like, Llama-3.1-8B, 8 x H100 (one node), 2 s / 100 ms: the memory-bound point
  b  coding-agent, Llama-3.1-70B, 4 x H100 (TP4) prefill + 8 x H20 (TP4) decode; colocated on the
     same 12 GPUs runs each type as mixed instances; 10 s / 100 ms
  c  coding-agent, Llama-3.1-70B, 16 x H100 at TP4 (two nodes), 10 s / 50 ms
  d  ToolBench-like, Llama-3.1-8B, 4 x H100 + 4 x H20, 2 s / 100 ms; a split P:D prefills on P H100s,
     the other H100s decode beside the H20s

    python benchmarks/ampd_grid.py --json out/ampd_grid.json --workers 2      # full grid, 2.5-10 min on 2 cores (240-950 CPU-s: docs/simulator.md)
    python benchmarks/ampd_grid.py --points b --quick --json out/grid_b.json  # development: 3 rates, shorter
    python benchmarks/ampd_grid.py --json out/grid_forward.json --ampd-variant ampd-forward-bank  # an option as AMPD
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenomy.core import SLO, Session
from tokenomy.experiment.choose import choose_on
from tokenomy.experiment.jobs import load_sessions
from tokenomy.experiment.results import Curve, RunResult
from tokenomy.experiment.spec import ClusterSpec, DeploymentSpec, ExperimentSpec, WorkloadSpec
from tokenomy.experiment.sweep import Job, run_job

OTHERS = ("disagg-offload", "colocated-offload", "colocated")
TAIL_SEEDS = (0, 1, 2)  # workload seed offsets the tail rule takes the median over (0: the grid's sample)
CPU_S = [0.0]  # CPU seconds of the simulations run by this invocation (cached ones not counted)
AMPD = ["ampd"]  # the variant that stands for AMPD (--ampd-variant: an option or ablation, e.g. ampd-forward-bank)


@dataclass(frozen=True)
class Point:
    workload: str
    model: str
    gpus: str
    slo: SLO
    rates: tuple[float, ...]
    duration_s: float
    ampd_splits: tuple[str, ...] = ()  # "P:D" (empty: the inventory's split, or the spec's default)
    disagg_splits: tuple[str, ...] = ()
    planning_rate: float = 0.0  # 0: the middle rate
    alt_gpus: tuple[str, ...] = ()  # other TP shapes of the same GPUs, open to every deployment

    def specs(self, rates: tuple[float, ...] | None = None, duration_s: float | None = None,
              first_split_only: bool = False) -> list[ExperimentSpec]:
        """One spec per inventory shape (``gpus``, then ``alt_gpus``)."""
        base = self.spec(rates, duration_s, first_split_only)
        return [base] + [replace(base, cluster=replace(base.cluster, gpus=g)) for g in self.alt_gpus]

    def spec(self, rates: tuple[float, ...] | None = None, duration_s: float | None = None,
             first_split_only: bool = False) -> ExperimentSpec:
        ampd = self.ampd_splits[:1] if first_split_only else self.ampd_splits
        disagg = self.disagg_splits[:1] if first_split_only else self.disagg_splits
        deps = [DeploymentSpec.parse(f"{AMPD[0]}@{s}") for s in ampd] or [DeploymentSpec(AMPD[0])]
        deps += [DeploymentSpec.parse(f"disagg-offload@{s}") for s in disagg] or [DeploymentSpec("disagg-offload")]
        deps += [DeploymentSpec("colocated-offload"), DeploymentSpec("colocated")]
        return ExperimentSpec(
            workload=WorkloadSpec(self.workload, duration_s=duration_s or self.duration_s),
            cluster=ClusterSpec(model=self.model, gpus=self.gpus, gpus_per_node=8),
            deployments=tuple(deps), slo=self.slo, rates=rates or self.rates)


POINTS: dict[str, Point] = {
    # 0:8, AMPD with no prefill instance: all of the KV memory decodes, which this
    # memory-bound point needs. (c) 0:4 and (d) 0:8 were measured worse than their splits here at
    # every rate tried (docs/ampd-results.md), so they are left out of the grid's time.
    "a": Point("gaia", "llama-3.1-8b", "h100:8", SLO(2.0, 0.1), (2.0, 2.5, 3.0, 3.5, 4.0), 120.0,
               ampd_splits=("1:7", "2:6", "0:8"), disagg_splits=("5:3", "3:5")),
    # H100s at TP2 cannot hold a 70B with a coding agent's context (141 GB of weights on 160 GB),
    # nor can H20s at TP2; the H20s at TP8 can (one instance of 768 GB): every deployment may take it.
    "b": Point("coding-agent", "llama-3.1-70b", "h100:4@tp4,h20:8@tp4", SLO(10.0, 0.1),
               (0.03, 0.045, 0.06, 0.08, 0.1), 1200.0, alt_gpus=("h100:4@tp4,h20:8@tp8",)),
    # 600 s of arrivals left every deployment >= 97% up to 0.09/s: the rates and
    # the duration are (b)'s scale, so the curves cross 90%.
    "c": Point("coding-agent", "llama-3.1-70b", "h100:16@tp4", SLO(10.0, 0.05), (0.04, 0.06, 0.08, 0.1, 0.12),
               1200.0, ampd_splits=("2:2", "1:3"), disagg_splits=("1:3",)),
    # 200 s of arrivals (40 s was about one session long: far from steady state). A split P:D
    # prefills on P of the H100s; the other H100s decode beside the four H20s.
    # (4:4, the H20s alone decoding, is left out: at most 14.8 sessions/s, benchmarks/ampd_decode_bound.py.)
    "d": Point("toolbench", "llama-3.1-8b", "h100:4,h20:4", SLO(2.0, 0.1), (16.0, 24.0, 32.0, 40.0), 200.0,
               ampd_splits=("2:6", "1:7"), disagg_splits=("2:6", "1:7")),
}


_SESSIONS: dict[tuple[WorkloadSpec, float | None], list[Session]] = {}
"""This worker's last workload: jobs go out heaviest rate first, so each rate's deployments
follow one another and a worker generates a rate's sessions once, not once per job."""


def _run(args: tuple[str, ExperimentSpec, Job]) -> tuple[str, Job, RunResult, float]:
    """One simulation, and the CPU seconds it took, generating its workload included when this
    worker had to (the machine may be shared: wall time is not cost)."""
    key, spec, job = args
    cpu0 = time.process_time()
    workload = (spec.workload, job.rate_per_s)
    sessions = _SESSIONS.get(workload)
    if sessions is None:
        _SESSIONS.clear()
        sessions = _SESSIONS[workload] = load_sessions(spec, job.rate_per_s)[0]
    res = run_job(spec, job, sessions)
    return key, job, res, time.process_time() - cpu0


Cand = tuple[int, DeploymentSpec, Any]  # (inventory index, deployment, split)
Key = tuple[int, Job]


def label(specs: list[ExperimentSpec], cand: Cand) -> str:
    i, dep, split = cand
    name = f"{dep.name}@{split[0]}:{split[1]}" if split else dep.name
    return f"{name} [{specs[i].cluster.gpus}]" if len(specs) > 1 else name


def candidates(specs: list[ExperimentSpec]) -> list[Cand]:
    return [(i, d, split) for i, spec in enumerate(specs) for d in spec.deployments for split in spec.splits_of(d)]


def curve(specs: list[ExperimentSpec], results: dict[Key, RunResult], cand: Cand) -> Curve | None:
    i, dep, split = cand
    rates = specs[0].rates or ()
    runs = [results.get((i, Job(dep, split, r))) for r in rates]
    if any(r is None for r in runs):  # not run (--quick runs one split per kind)
        return None
    return Curve(dep.label, split, rates, tuple(r for r in runs if r is not None), specs[0].attainment_target)


def best_curves(specs: list[ExperimentSpec], results: dict[Key, RunResult]) -> tuple[dict[str, Curve], dict[str, Cand]]:
    """Each kind's (ampd, each other deployment) best curve over its shapes, and that shape."""
    curves: dict[str, Curve] = {}
    chosen: dict[str, Cand] = {}
    for cand in candidates(specs):
        c = curve(specs, results, cand)
        if c is None:
            continue
        kind = "ampd" if cand[1].name == AMPD[0] else cand[1].name
        if kind not in curves or c.score() > curves[kind].score():
            curves[kind], chosen[kind] = c, cand
    return curves, chosen


def tail_cells(specs: list[ExperimentSpec], results: dict[Key, RunResult]) -> list[tuple[float, str, Cand, Cand]]:
    """The (rate, best other kind, AMPD's shape, the other's shape) the tail rule judges: every rate
    where AMPD's best curve attains >= 90% on seed 0, against the best other there by attainment."""
    curves, chosen = best_curves(specs, results)
    others = [k for k in curves if k != "ampd"]
    cells = []
    for i, rate in enumerate(specs[0].rates or ()):
        if curves["ampd"].attainment[i] < 0.9:
            continue
        best = max(others, key=lambda k: curves[k].attainment[i])
        cells.append((rate, best, chosen["ampd"], chosen[best]))
    return cells


def seeded(specs: list[ExperimentSpec], seed: int) -> list[ExperimentSpec]:
    """``specs`` on another workload sample (seed offset ``seed``; 0: the grid's own)."""
    return [replace(s_, workload=replace(s_.workload, seed=s_.workload.seed + seed)) for s_ in specs]


def median_tail(values: list[float | None]) -> float:
    """Median over seeds of P99 TTFT among TPOT-met turns; a seed with no such turn counts as infinite."""
    xs = sorted(float("inf") if v is None else v for v in values)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def tail_rule(specs: list[ExperimentSpec], results: dict[Key, RunResult],
              by_seed: dict[int, dict[Key, RunResult]]) -> dict[str, Any]:
    """The tail rule (module docstring): per judged rate, both sides' P99 TTFT among TPOT-met
    turns on every seed (``by_seed[s]``: the runs on seed offset ``s``; seed 0 is ``results``),
    their medians, and whether AMPD's is no worse. ``no_worse`` is True when no rate is judged
    (AMPD under 90% everywhere); ``judged_rates`` says which rates were."""
    rows = []
    for rate, best, mine, theirs in tail_cells(specs, results):
        vals: dict[str, list[float | None]] = {"ampd": [], best: []}
        for seed in TAIL_SEEDS:
            runs = results if seed == 0 else by_seed.get(seed, {})
            for kind, (i, dep, split) in (("ampd", mine), (best, theirs)):
                run = runs.get((i, Job(dep, split, rate)))
                vals[kind].append(None if run is None else run.summary.ttft_p99_tpot_met_s)
        a, o = median_tail(vals["ampd"]), median_tail(vals[best])
        rows.append({"rate": rate, "best_other": best, "ampd_shape": label(specs, mine),
                     "other_shape": label(specs, theirs), "seeds": list(TAIL_SEEDS),
                     "ampd_p99_ttft_tpot_met_s": vals["ampd"], "other_p99_ttft_tpot_met_s": vals[best],
                     "ampd_median_s": a, "other_median_s": o, "no_worse": a <= o})
    return {"per_rate": rows, "judged_rates": [r["rate"] for r in rows],
            "no_worse": all(r["no_worse"] for r in rows)}


def tail_jobs(specs: list[ExperimentSpec], results: dict[Key, RunResult]) -> list[Key]:
    """The runs the tail rule needs on each seed other than 0 (the same for every seed)."""
    jobs: list[Key] = []
    for rate, _, mine, theirs in tail_cells(specs, results):
        for i, dep, split in (mine, theirs):
            if (i, Job(dep, split, rate)) not in jobs:
                jobs.append((i, Job(dep, split, rate)))
    return jobs


def compare(specs: list[ExperimentSpec], results: dict[Key, RunResult],
            by_seed: dict[int, dict[Key, RunResult]] | None = None) -> dict[str, Any]:
    """Best shape per kind (ampd, each other deployment), then AMPD against the best other."""
    rates = specs[0].rates or ()
    curves, chosen_cand = best_curves(specs, results)
    chosen = {k: label(specs, c) for k, c in chosen_cand.items()}
    split_goodput: dict[str, float] = {}
    for cand in candidates(specs):
        c = curve(specs, results, cand)
        if c is not None:
            split_goodput[label(specs, cand)] = c.max_rate_at_target
    ampd = curves["ampd"]
    others = {k: c for k, c in curves.items() if k != "ampd"}
    per_rate, band = [], []
    ttft_ok = True
    for i, rate in enumerate(rates):
        best_kind = max(others, key=lambda k: others[k].attainment[i])
        theirs, mine = others[best_kind].attainment[i], ampd.attainment[i]
        a_ttft = ampd.runs[i].summary.ttft_p99_s
        o_ttft = others[best_kind].runs[i].summary.ttft_p99_s
        row = {"rate": rate, "best_other": best_kind, "other_attainment": theirs, "ampd_attainment": mine,
               "ampd_ttft_p99_s": a_ttft, "other_ttft_p99_s": o_ttft}
        per_rate.append(row)
        if 0.3 <= theirs <= 0.7 and theirs > 0:
            band.append(mine / theirs)
        if mine >= 0.9 and a_ttft is not None and o_ttft is not None and a_ttft > o_ttft:
            ttft_ok = False
    goodput = {k: c.max_rate_at_target for k, c in curves.items()}
    best_other = max(others, key=lambda k: goodput[k])
    tail = tail_rule(specs, results, by_seed or {})
    return {
        "curves": {k: {"shape": chosen[k], "split": list(c.split) if c.split else None, "attainment": c.attainment,
                       "goodput_rps": goodput[k],
                       "ttft_p99_s": [r.summary.ttft_p99_s for r in c.runs],
                       "tpot_p99_s": [r.summary.tpot_p99_s for r in c.runs],
                       "p99_ttft_tpot_met": [r.summary.ttft_p99_tpot_met_s for r in c.runs],
                       "kv_transfers": [r.kv_transfers for r in c.runs]} for k, c in curves.items()},
        "per_rate": per_rate,
        "band_ratio": sum(band) / len(band) if band else None,
        "band_rates": [r["rate"] for r in per_rate if 0.3 <= r["other_attainment"] <= 0.7],
        "goodput_ratio": goodput["ampd"] / goodput[best_other] if goodput[best_other] > 0 else None,
        "best_other_goodput": {"deployment": best_other, "goodput_rps": goodput[best_other]},
        "p99_ttft_no_worse": ttft_ok,
        "p99_ttft_tpot_met": {k: [r.summary.ttft_p99_tpot_met_s for r in c.runs] for k, c in curves.items()},
        "p99_ttft_tpot_met_no_worse": tail["no_worse"],
        "tail_rule": tail,
        "goodput": goodput,
        "split_goodput": split_goodput,
    }


def _cached(cache: Path | None, spec: ExperimentSpec, job: Job) -> Path | None:
    if cache is None:
        return None
    spec_key = spec.to_dict()
    if job.rate_per_s is not None and job.rate_per_s >= 0:
        # A simulation reads only its own deployment (``spec.sim_config(job.deployment, ...)``), not
        # the spec's list of the others: keyed without that list, a baseline's cell carries over to a
        # run with another --ampd-variant. The planner's choice (negative rate) weighs the whole list.
        spec_key.pop("deployments", None)
    key = json.dumps([spec_key, job.deployment.label, job.split, job.rate_per_s], sort_keys=True)
    return cache / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.pkl"


def run_point(key: str, specs: list[ExperimentSpec], workers: int, cache: Path | None, t0: float,
              cpu: dict[str, float]) -> dict[Key, RunResult]:
    """Every shape (inventory, split) of every deployment at every rate of one point; finished
    jobs are kept in ``cache`` (a rerun skips them: the simulator is deterministic). ``cpu``: CPU
    seconds per job, filled in.

    (Screening shapes at the middle rate and running only the best at every rate was tried and
    dropped: at (b) it took AMPD's H20-TP8 shape, 93.2% against TP4's 92.2% at 0.06/s, though
    TP4 leads at 0.08/s, 74.7% to 63.0%; and colocated-offload's TP4, where TP8 leads at 0.08/s.)"""
    rates = specs[0].rates or ()
    results: dict[Key, RunResult] = {}
    _run_jobs(key, specs, [(c[0], Job(c[1], c[2], r)) for c in candidates(specs) for r in rates],
              workers, cache, t0, results, cpu)
    return results


def run_tail_seeds(key: str, specs: list[ExperimentSpec], results: dict[Key, RunResult], workers: int,
                   cache: Path | None, t0: float, cpu: dict[str, float]) -> dict[int, dict[Key, RunResult]]:
    """The runs the tail rule needs on the other seeds (``tail_jobs``), per seed offset."""
    jobs = tail_jobs(specs, results)
    by_seed: dict[int, dict[Key, RunResult]] = {}
    for seed in TAIL_SEEDS:
        if seed == 0:
            continue
        seed_cpu: dict[str, float] = {}
        by_seed[seed] = {}
        _run_jobs(f"{key} seed {seed}", seeded(specs, seed), jobs, workers, cache, t0, by_seed[seed], seed_cpu)
        cpu.update({f"seed {seed}: {name}": v for name, v in seed_cpu.items()})
    return by_seed


def _run_jobs(key: str, specs: list[ExperimentSpec], jobs: list[Key], workers: int, cache: Path | None, t0: float,
              results: dict[Key, RunResult], cpu: dict[str, float]) -> None:
    jobs = sorted((j for j in jobs if j not in results), key=lambda j: -(j[1].rate_per_s or 0))  # heavy first
    todo = []
    for i, job in jobs:
        path = _cached(cache, specs[i], job)
        if path is not None and path.exists():
            results[(i, job)] = pickle.loads(path.read_bytes())
        else:
            todo.append((i, job))
    if not todo:
        return
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(_run, (key, specs[i], job)): i for i, job in todo}
        for fut in as_completed(futures):
            i = futures[fut]
            _, job, res, cpu_s = fut.result()
            results[(i, job)] = res
            CPU_S[0] += cpu_s
            name = label(specs, (i, job.deployment, job.split))
            cpu[f"{name} @ {job.rate_per_s:g}"] = round(cpu_s, 1)
            path = _cached(cache, specs[i], job)
            if path is not None:
                path.write_bytes(pickle.dumps(res))
            print(f"[{len(results)} {time.perf_counter() - t0:6.0f}s] {key} {name} @ {job.rate_per_s:g}/s: "
                  f"{res.summary.slo_attainment:.1%} ({res.wall_s:.0f} s wall, {cpu_s:.0f} s CPU)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--points", default="a,b,c,d")
    ap.add_argument("--quick", action="store_true",
                    help="development: first, middle and last rate, half duration, each kind's first split only")
    ap.add_argument("--no-planner", action="store_true", help="skip the planner's choice")
    ap.add_argument("--cache", type=Path, default=None, help="keep each finished simulation here (reruns skip it)")
    ap.add_argument("--ampd-variant", default="ampd",
                    help="the sim variant that runs as AMPD (an option or ablation, e.g. ampd-forward-bank; default: ampd)")
    args = ap.parse_args()
    AMPD[0] = args.ampd_variant
    keys = [k.strip() for k in args.points.split(",") if k.strip()]
    unknown = [k for k in keys if k not in POINTS]
    if unknown:
        print(f"ampd_grid: error: unknown point(s) {unknown}; known: {', '.join(POINTS)}", file=sys.stderr)
        return 2
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    points: dict[str, Any] = {}
    sim_s = 0.0
    for k in keys:
        p = POINTS[k]
        rates = (p.rates[0], p.rates[len(p.rates) // 2], p.rates[-1]) if args.quick else p.rates
        specs = p.specs(rates, p.duration_s / 2 if args.quick else None, first_split_only=args.quick)
        spec = specs[0]
        cpu: dict[str, float] = {}
        cpu0 = CPU_S[0]
        results = run_point(k, specs, args.workers, args.cache, t0, cpu)
        by_seed = run_tail_seeds(k, specs, results, args.workers, args.cache, t0, cpu)
        sim_s += sum(r.wall_s for r in results.values()) + sum(r.wall_s for d in by_seed.values() for r in d.values())
        out = compare(specs, results, by_seed)
        if not args.no_planner:
            assert spec.rates is not None
            rate = p.planning_rate or spec.rates[len(spec.rates) // 2]
            path = _cached(args.cache, spec, Job(DeploymentSpec(AMPD[0]), None, -rate))  # the choice's own key
            if len(specs) > 1 and path is not None:
                path = path.with_suffix(f".{len(specs)}.pkl")
            if path is not None and path.exists():
                choice = pickle.loads(path.read_bytes())
            else:
                cpu1 = time.process_time()
                # The grid's own candidates, at their shapes (the chooser sees no grid result).
                choice = choose_on([(s_, s_.deployments) for s_ in specs], rate, workers=args.workers,
                                   duration_s=spec.workload.duration_s)
                CPU_S[0] += time.process_time() - cpu1  # (its pool's children count in process_cpu_s)
                if path is not None:
                    path.write_bytes(pickle.dumps(choice))
            sim_s += sum(r.wall_s for r in choice.results)
            inv = next((i for i, s_ in enumerate(specs) if (s_.cluster.gpus or "") == choice.gpus), 0)
            picked = next(c for c in candidates(specs)
                          if c[0] == inv and c[1].name == choice.deployment and c[2] == choice.split)
            if label(specs, picked) not in out["split_goodput"]:  # a shape --quick left out: its curve too
                _run_jobs(k, specs, [(inv, Job(picked[1], picked[2], r)) for r in spec.rates], args.workers,
                          args.cache, t0, results, cpu)
                out = compare(specs, results, by_seed)
            chosen = out["split_goodput"][label(specs, picked)]
            best = max(out["goodput"].values())
            out["planner"] = choice.to_dict()
            out["planner_choice"] = label(specs, picked)
            out["planner_predicted_goodput_rps"] = choice.predicted_goodput_rps
            out["planner_simulated_goodput_rate"] = chosen
            out["planner_goodput_ratio"] = chosen / best if best > 0 else None
        out["spec"] = spec.to_dict()
        out["inventories"] = [s_.cluster.gpus for s_ in specs]
        out["cpu_s"] = {"grid": round(CPU_S[0] - cpu0, 1), "per_job": cpu}
        points[k] = out
        _print(k, out)
        _write(args, points, t0, sim_s)
    return 0


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (every pool is shut down per point)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _write(args: argparse.Namespace, points: dict[str, Any], t0: float, sim_s: float) -> None:
    keys = ("band_ratio", "goodput_ratio", "p99_ttft_no_worse", "p99_ttft_tpot_met_no_worse", "planner_choice",
            "planner_goodput_ratio")
    summary = {k: {key: v.get(key) for key in keys} for k, v in points.items()}
    payload = {"points": {k: {**summary[k], "detail": points[k]} for k in points},
               "wall_s": round(time.perf_counter() - t0, 1), "simulation_s": round(sim_s, 1),
               "grid_cpu_s": round(CPU_S[0], 1), "process_cpu_s": round(_cpu_s(), 1),
               "workers": args.workers, "quick": args.quick}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(json.dumps({"points": summary, "wall_s": payload["wall_s"], "simulation_s": payload["simulation_s"],
                      "grid_cpu_s": payload["grid_cpu_s"], "process_cpu_s": payload["process_cpu_s"]},
                     indent=2), flush=True)


def _print(key: str, out: dict[str, Any]) -> None:
    print(f"== point {key} ==")
    for kind, c in out["curves"].items():
        att = " ".join(f"{a:6.1%}" for a in c["attainment"])
        split = f"@{c['split'][0]}:{c['split'][1]}" if c["split"] else ""
        print(f"  {kind + split:28s} {att}   goodput {c['goodput_rps']:.3g}/s")
    for row in out["tail_rule"]["per_rate"]:
        print(f"  tail rule @ {row['rate']:g}/s: ampd {row['ampd_median_s']:.3g} s vs {row['best_other']} "
              f"{row['other_median_s']:.3g} s (P99 TTFT of TPOT-met turns, median of seeds {row['seeds']})")
    print(f"  band ratio {out['band_ratio']}, goodput ratio {out['goodput_ratio']}, "
          f"P99 TTFT no worse {out['p99_ttft_no_worse']}, tail rule {out['p99_ttft_tpot_met_no_worse']}, "
          f"planner {out.get('planner_choice')} ({out.get('planner_goodput_ratio')})")


if __name__ == "__main__":
    sys.exit(main())
