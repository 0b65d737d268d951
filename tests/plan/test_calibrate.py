"""Calibration runs long enough for their P95s: a slow shape's run is lengthened until its
measurement window expects MIN_WINDOW_REQUESTS requests, and factors from an earlier rule are not
reused from the cache."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tokenomy.plan import Candidate, PlanRequest, calibrate, workload_stats
from tokenomy.plan.options import build_models
from tokenomy.workload.registry import load_workload

GPU = "H100-SXM"


def _setup(rate: float) -> tuple[PlanRequest, Any, dict[Candidate, Any], Candidate]:
    request = PlanRequest("llama-3.1-8b", {GPU: 8})
    stats = workload_stats("chat", load_workload("chat", rate_per_s=rate, duration_s=60, seed=0), rate)
    models, _ = build_models(request.model, request.inventory, stats, request.limits, request.gpus_per_node,
                             request.tp_choices)
    return request, stats, models, Candidate("mixed", GPU, 1)


def _fake_simulate(seen: list[float]):  # type: ignore[no-untyped-def]
    """Stands in for the simulator: records every request at a steady 1 s TTFT and 20 ms TPOT."""

    def simulate(sessions: list[Any], config: Any, slo: Any) -> Any:
        seen.append(config.horizon_s)
        records = [SimpleNamespace(arrival_s=s.start_s, first_token_s=s.start_s + 1.0, finished=True, output_tokens=11,
                                   finish_s=s.start_s + 1.2) for s in sessions]
        return SimpleNamespace(records=records)

    return simulate


def test_a_slow_shape_is_calibrated_over_enough_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    request, stats, models, cand = _setup(10.0)
    per_instance = calibrate.TARGET_LOAD * calibrate.capacity_rps(models[cand])
    horizons: list[float] = []
    monkeypatch.setattr(calibrate, "simulate", _fake_simulate(horizons))
    # A window of 10 s at the calibration rate expects fewer than MIN_WINDOW_REQUESTS requests.
    assert per_instance * 10.0 < calibrate.MIN_WINDOW_REQUESTS
    out = calibrate.calibrate_one(request, stats, cand, models, duration_s=40.0, warmup_s=20.0, tail_s=10.0)
    window = horizons[0] - 20.0 - 10.0
    assert window == pytest.approx(calibrate.MIN_WINDOW_REQUESTS / per_instance)
    assert out["offered_rps"] * window >= 0.8 * calibrate.MIN_WINDOW_REQUESTS  # (Poisson arrivals)
    assert "ttft" in out and "tpot" in out


def test_a_long_enough_run_is_left_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    request, stats, models, cand = _setup(10.0)
    per_instance = calibrate.TARGET_LOAD * calibrate.capacity_rps(models[cand])
    asked = 30.0 + calibrate.MIN_WINDOW_REQUESTS / per_instance * 2
    horizons: list[float] = []
    monkeypatch.setattr(calibrate, "simulate", _fake_simulate(horizons))
    calibrate.calibrate_one(request, stats, cand, models, duration_s=asked, warmup_s=20.0, tail_s=10.0)
    assert horizons == [asked]


def test_factors_of_an_earlier_rule_are_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    request, stats, _, cand = _setup(10.0)
    key = calibrate.cache_key(request, stats, cand)
    monkeypatch.setattr(calibrate, "CALIBRATION_VERSION", calibrate.CALIBRATION_VERSION - 1)
    assert calibrate.cache_key(request, stats, cand) != key
