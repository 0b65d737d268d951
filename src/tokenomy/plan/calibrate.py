"""Calibrate the queueing model against short simulator runs of one instance, and cache it.

For a candidate shape, one instance of it is simulated at ``TARGET_LOAD`` of the capacity
the queueing model predicts for it (prefill: 1 prefill instance and decode instances of the
largest TP sized to be lightly loaded; decode: the mirror image; mixed: one colocated
instance). Requests arriving in the steady window (after ``warmup_s``, and ``tail_s`` before
the end, so long agent sessions have filled in and nothing is cut) give the simulated P95
TTFT and TPOT; the model is evaluated at the rate actually offered in that window; the
factor is their ratio, clipped to ``FACTOR_RANGE``. One factor per (shape, metric): it
carries what the approximation leaves out (batching several prompts into one step,
prefix-cache misses under LRU, admission waits, KV-link queueing).

Results are cached in a JSON file keyed by model, shape, workload shape and engine limits,
so a second ``tokenomy plan --calibrate`` is as fast as an uncalibrated one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenomy.core import Session
from tokenomy.plan.options import Candidate, build_models
from tokenomy.plan.planner import PlanRequest
from tokenomy.plan.queueing import InstanceModel
from tokenomy.plan.stats import WorkloadStats
from tokenomy.sim import SimConfig, simulate
from tokenomy.workload.registry import load_workload

TARGET_LOAD = 0.6
"""Calibration load, as a share of the model's capacity of the instance (a labelled default)."""
FACTOR_RANGE = (0.5, 4.0)
MIN_WINDOW_REQUESTS = 200
"""Requests a calibration run's measurement window must hold (a labelled default): its run is
lengthened until the window expects this many at the calibration rate, so a factor's P95 rests on
about ten requests above it. (A long-context 70B session workload at 0.25 requests/s per
instance put 30 requests in a 120 s window: its P95 was the second-largest of them, and the
factor it gave, clipped at 0.5, misled the plan of a pool.)"""
CALIBRATION_VERSION = 2
"""Part of every cache key: factors computed by an earlier rule are not reused."""
DEFAULT_CACHE = Path("~/.cache/tokenomy/plan-calibration.json")


class CalibrationCache:
    """A JSON file of calibration factors; ``path`` None means the default under ``~/.cache``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = (path or DEFAULT_CACHE).expanduser()
        self._data: dict[str, Any] = {}
        if self.path.is_file():
            try:
                self._data = json.loads(self.path.read_text())
            except json.JSONDecodeError:
                raise ValueError(f"--calibration-cache: {self.path} is not valid JSON") from None

    def get(self, key: str) -> dict[str, float] | None:
        return self._data.get(key)

    def put(self, key: str, value: dict[str, float]) -> None:
        self._data[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._data, indent=1, sort_keys=True))
        tmp.replace(self.path)


def cache_key(request: PlanRequest, stats: WorkloadStats, cand: Candidate) -> str:
    """Model, shape, engine limits, SLO and the workload's shape (name and length percentiles)."""
    shape = [stats.name] + [round(float(np.percentile(a, q))) for a in (stats.prompt_tokens, stats.output_tokens)
                            for q in (50, 95)]
    lim = request.limits
    raw = json.dumps([request.model, cand.key, shape, lim.max_num_batched_tokens, lim.max_num_seqs,
                      lim.decode_max_num_seqs, lim.gpu_memory_utilization, CALIBRATION_VERSION])
    return f"{cand.key}|{hashlib.sha1(raw.encode()).hexdigest()[:12]}"


def capacity_rps(model: InstanceModel, hi: float = 1e4) -> float:
    """The highest per-instance request rate the model accepts (bisection)."""
    lo = 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if model.predict(mid).feasible:
            lo = mid
        else:
            hi = mid
    return lo


def _window_p95(records: Sequence[Any], w0: float, w1: float) -> tuple[float, float, float]:
    """``(requests per second offered in [w0, w1), TTFT P95, TPOT P95)`` of those requests."""
    rec = [r for r in records if w0 <= r.arrival_s < w1]
    ttft = [r.first_token_s - r.arrival_s for r in rec if r.first_token_s is not None]
    tpot = [(r.finish_s - r.first_token_s) / (r.output_tokens - 1) for r in rec
            if r.finished and r.output_tokens > 1 and r.first_token_s is not None]
    return len(rec) / (w1 - w0), _p95(ttft), _p95(tpot)


def _p95(values: list[float]) -> float:
    return float(np.percentile(values, 95)) if values else float("nan")


def calibrate_one(request: PlanRequest, stats: WorkloadStats, cand: Candidate, models: dict[Candidate, InstanceModel],
                  duration_s: float, warmup_s: float, tail_s: float = 30.0) -> dict[str, float]:
    """Simulate one instance of ``cand`` and return ``{"ttft": f, "tpot": f, ...}`` (see module doc)."""
    model = models[cand]
    per_instance = TARGET_LOAD * capacity_rps(model)
    # A window long enough to expect MIN_WINDOW_REQUESTS requests at the calibration rate.
    window_s = max(duration_s - warmup_s - tail_s, MIN_WINDOW_REQUESTS / max(per_instance, 1e-9))
    duration_s = warmup_s + window_s + tail_s
    helper_tp = max(c.tp for c in models if c.gpu == cand.gpu)
    kw: dict[str, Any] = {"model": request.model, "gpu": cand.gpu, "tp": cand.tp, "horizon_s": duration_s,
                          "max_num_batched_tokens": request.limits.max_num_batched_tokens,
                          "max_num_seqs": request.limits.max_num_seqs}
    if cand.role == "mixed":
        config = SimConfig(deployment="colocated", instances=1, **kw)
    else:
        other_role = "decode" if cand.role == "prefill" else "prefill"
        helper = models[Candidate(other_role, cand.gpu, helper_tp)]
        helpers = max(1, int(np.ceil(per_instance / (0.4 * max(capacity_rps(helper), 1e-9)))))
        kw |= {f"{cand.role}_tp": cand.tp, f"{other_role}_tp": helper_tp, cand.role: 1, other_role: helpers}
        config = SimConfig(deployment="disagg", **kw)
    session_rate = stats.session_rate_per_s * per_instance / stats.request_rate_per_s
    sessions = load_workload(stats.name, rate_per_s=session_rate, duration_s=duration_s, seed=1)
    result = simulate(sessions, config, request.slo)
    offered, ttft, tpot = _window_p95(result.records, warmup_s, duration_s - tail_s)
    # The uncalibrated model of one instance, at the rate (and parked KV) the window offered.
    scaled = stats.scaled(max(offered, 1e-9) / stats.request_rate_per_s)
    probe = InstanceModel(cand.role, model.perf, scaled, max_num_batched_tokens=model.budget,
                          max_num_seqs=model.max_num_seqs, gpu_memory_utilization=request.limits.gpu_memory_utilization)
    pred = probe.predict(offered, probe.hit_fraction(1))
    out: dict[str, float] = {"offered_rps": offered}
    for metric, sim_v, pred_v in (("ttft", ttft, pred.ttft_p95_s), ("tpot", tpot, pred.tpot_p95_s)):
        if pred_v and pred.feasible and sim_v == sim_v:  # NaN-safe
            out[metric] = float(np.clip(sim_v / pred_v, *FACTOR_RANGE))
            out[f"{metric}_sim_s"], out[f"{metric}_model_s"] = sim_v, pred_v
    return out


def calibrate_plan_inputs(
    request: PlanRequest, stats: WorkloadStats, sessions: Sequence[Session], cache: CalibrationCache,
    *, duration_s: float | None = None, on_progress: Callable[[str], Any] | None = None,
) -> dict[str, dict[str, float]]:
    """Factors for every candidate shape of ``request`` (cached ones reused, others simulated).

    ``duration_s`` of simulated arrivals per calibration run (default: 300 s for multi-turn
    workloads, whose sessions take minutes to fill in, 120 s otherwise).
    """
    multi_turn = any(len(s.turns) > 1 for s in sessions)
    duration = duration_s or (300.0 if multi_turn else 120.0)
    warmup = duration / 2 if multi_turn else 20.0
    models, _ = build_models(request.model, request.inventory, stats, request.limits, request.gpus_per_node,
                             request.tp_choices)
    out: dict[str, dict[str, float]] = {}
    for cand in sorted(models):
        key = cache_key(request, stats, cand)
        factors = cache.get(key)
        if factors is None:
            if on_progress:
                on_progress(f"calibrating {cand.key} ({duration:.0f} s simulated at least)")
            factors = calibrate_one(request, stats, cand, models, duration, warmup)
            cache.put(key, factors)
        out[cand.key] = factors
    return out
