"""How close is the planner's latency model to the simulator on every topology, not just the plan?

Reads a ``benchmarks/plan_quality.py`` JSON and, for every simulated topology that met the
SLOs for at least half its requests, prices its prefill (or mixed) pool and its decode pool
with the planner's model at the rate that JSON planned for (calibration factors as
embedded there, and without them; and the former independent-queue model side by side)
and compares the predicted P95 TTFT and TPOT with the
simulated ones. No simulation: it takes seconds.

    python benchmarks/plan_model_error.py --quality plan_quality.json --json OUT

Writes ``{"workloads": {name: {"ttft"|"tpot": {"calibrated"|"raw"|"independent": {"n", "mean_signed_error",
"mean_abs_error", "within_25pct"}}, "rows": [...]}}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tokenomy.plan import workload_stats
from tokenomy.plan.options import Candidate, EngineLimits, build_models
from tokenomy.plan.queueing import InstanceModel
from tokenomy.workload.registry import load_workload

SESSION_RATES = {"gaia": 1.0, "chat": 100.0}
"""The session rates plan_quality.py's cases use (its ``CASES``)."""
KINDS = ("calibrated", "raw", "independent")
"""The pool model with the JSON's calibration factors, without them, and the former model
(each instance an independent queue fed ``1/count`` of the load) with the factors."""


def _pools(topo: list[int]) -> list[tuple[str, int, int]]:
    n_p, tp_p, n_d, tp_d = topo
    if n_d == 0:
        return [("mixed", tp_p, n_p)]
    return [("prefill", tp_p, n_p), ("decode", tp_d, n_d)]


def _predict(models: dict[Candidate, InstanceModel], gpu: str, topo: list[int], rate: float,
             factors: dict[str, dict[str, float]] | None, pooled: bool = True) -> dict[str, float | None]:
    out: dict[str, float | None] = {"ttft": None, "tpot": None}
    for role, tp, count in _pools(topo):
        cand = Candidate(role, gpu, tp)
        model = models[cand]
        f = (factors or {}).get(cand.key, {})
        model.ttft_factor, model.tpot_factor = f.get("ttft", 1.0), f.get("tpot", 1.0)
        p = model.predict(rate / count, model.hit_fraction(count), servers=count if pooled else 1)
        if not p.feasible:
            return {"ttft": None, "tpot": None}
        for metric in ("ttft", "tpot"):
            v = getattr(p, f"{metric}_p95_s")
            if v is not None:
                out[metric] = v
    return out


def _summary(errors: list[float]) -> dict[str, float | int]:
    e = np.asarray(errors)
    if not len(e):
        return {"n": 0}
    return {"n": len(e), "mean_signed_error": round(float(e.mean()), 3),
            "mean_abs_error": round(float(np.abs(e).mean()), 3),
            "within_25pct": round(float((np.abs(e) <= 0.25).mean()), 3)}


def score(name: str, res: dict[str, Any], model: str, gpu: str, gpus: int) -> dict[str, Any]:
    sessions = load_workload(name, rate_per_s=SESSION_RATES[name], duration_s=600.0, seed=0)
    stats = workload_stats(name, sessions, SESSION_RATES[name])
    stats = stats.scaled(res["planned_request_rps"] / stats.request_rate_per_s)
    models, _ = build_models(model, {gpu: gpus}, stats, EngineLimits(), 8)
    rows: list[dict[str, Any]] = []
    errors: dict[tuple[str, str], list[float]] = {(m, k): [] for m in ("ttft", "tpot") for k in KINDS}
    for sim in res["simulated"]:
        if sim["attainment"] < 0.5:
            continue
        row: dict[str, Any] = {"topology": sim["topology"]}
        for kind in KINDS:
            factors = None if kind == "raw" else res.get("calibration")
            pred = _predict(models, gpu, sim["topology"], stats.request_rate_per_s, factors,
                            pooled=kind != "independent")
            for metric in ("ttft", "tpot"):
                p, s = pred[metric], sim[f"{metric}_p95_s"]
                row[f"{metric}_{kind}_s"] = p
                if p is not None and s:
                    errors[(metric, kind)].append(p / s - 1.0)
        row["ttft_sim_s"], row["tpot_sim_s"] = sim["ttft_p95_s"], sim["tpot_p95_s"]
        rows.append(row)
    out: dict[str, Any] = {m: {k: _summary(errors[(m, k)]) for k in KINDS} for m in ("ttft", "tpot")}
    out["rows"] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quality", type=Path, required=True, help="a plan_quality.py JSON")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        quality = json.loads(args.quality.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"--quality: cannot read {args.quality}: {exc}", file=sys.stderr)
        return 2
    out: dict[str, Any] = {"source": str(args.quality), "workloads": {}}
    for name, res in quality.get("workloads", {}).items():
        scored = score(name, res, quality["model"], quality["gpu"], quality["gpus"])
        out["workloads"][name] = scored
        for metric in ("ttft", "tpot"):
            print(f"{name} {metric}: " + "; ".join(f"{k} {scored[metric][k]}" for k in KINDS))
    args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
