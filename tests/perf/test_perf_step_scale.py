"""The calibration's step scale (``step_scale``): how much slower an engine's steps run under a live
stream than in the profile's isolated probes, measured from a replay's mean token gap against its
simulation, multiplied into every simulated step; ``frontend_s`` is then measured on the scaled steps."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from helpers.calibrated_sim import STEPS, calibration, run_calibrated, three_turn_sessions
from tokenomy.core import RequestRecord, Session, StepShape
from tokenomy.perf.engine_calibration import (
    CalibratedPerfModel,
    EngineCalibration,
    fit_step_scale,
    frontend_latency,
    load_calibration,
    mean_token_gap,
    pool_calibrations,
)
from tokenomy.perf.hardware import get_gpu
from tokenomy.perf.model import PerfModel
from tokenomy.perf.models import get_model
from tokenomy.perf.stepfit import Measurement, decode_step, prefill_steps


def _cal(step_scale: float = 1.0, frontend_s: float = 0.0, on: str = "all") -> EngineCalibration:
    return calibration(frontend_s, step_scale, on)


def _sessions(n: int) -> list[Session]:
    """``n`` agent-like sessions of three turns, 0.2 s apart (several decode at once), 0.3 s of tool time."""
    return three_turn_sessions(n, 0.2, 0.3, (40, 30, 50))


def _by_turn(records: list[RequestRecord]) -> list[RequestRecord]:
    return sorted(records, key=lambda r: (r.session_id, r.turn))


def test_the_simulator_multiplies_every_step_by_the_scale(tmp_path: Path) -> None:
    """One session alone (no batching to shift): at step_scale 1.5 each TTFT (all prefill steps) and each
    token gap (decode steps) is exactly 1.5 times the unscaled one."""
    (session,) = _sessions(1)
    plain, slow = run_calibrated(_cal(), [session], tmp_path), run_calibrated(_cal(1.5), [session], tmp_path)
    assert len(plain) == len(slow) == 3
    for a, b in zip(_by_turn(plain), _by_turn(slow), strict=True):
        assert b.ttft_s == pytest.approx(1.5 * a.ttft_s, rel=1e-9)  # type: ignore[operator]
        assert b.tpot_s == pytest.approx(1.5 * a.tpot_s, rel=1e-9)  # type: ignore[operator]
    # On decode steps only: the prefills (the whole TTFT of a request alone) keep the profiled speed.
    for a, b in zip(_by_turn(plain), _by_turn(run_calibrated(_cal(1.5, on="decode"), [session], tmp_path)), strict=True):
        assert b.ttft_s == pytest.approx(a.ttft_s, rel=1e-9)
        assert b.tpot_s == pytest.approx(1.5 * a.tpot_s, rel=1e-9)  # type: ignore[operator]


@pytest.mark.parametrize("on", ["all", "decode"])
def test_fit_step_scale_recovers_an_engine_20_percent_slower(on: str, tmp_path: Path) -> None:
    """A 'live' replay on an engine whose steps (all, or those without a prefill) take 20% longer than
    fitted: the fit on the same steps finds 1.2 from the
    replay's mean token gap alone (slower steps batch more, so the gap grows faster than the scale: the
    first ratio overshoots and later guesses interpolate), and the workload simulated at that scale has
    the slow engine's TPOT where the unscaled steps price it 10% or more fast."""
    sessions = _sessions(8)
    live = run_calibrated(_cal(1.2, on=on), sessions, tmp_path)
    gap = mean_token_gap(live)
    assert gap is not None
    fit = fit_step_scale(gap, lambda scale: run_calibrated(_cal(scale, on=on), sessions, tmp_path))
    assert fit.step_scale == pytest.approx(1.2, rel=0.005)
    assert fit.tried[0][0] == 1.0 and len(fit.tried) <= 8
    assert fit.simulated_gap_s == pytest.approx(gap, rel=0.005)
    plain_tpot = sorted(r.tpot_s for r in run_calibrated(_cal(), sessions, tmp_path))  # type: ignore[type-var]
    scaled_tpot = sorted(r.tpot_s for r in run_calibrated(_cal(fit.step_scale, on=on), sessions, tmp_path))  # type: ignore[type-var]
    live_tpot = sorted(r.tpot_s for r in live)  # type: ignore[type-var]
    median = len(live_tpot) // 2
    assert plain_tpot[median] < 0.9 * live_tpot[median]
    assert scaled_tpot[median] == pytest.approx(live_tpot[median], rel=0.01)


def test_frontend_latency_measured_on_the_scaled_steps_does_not_absorb_the_slowdown(tmp_path: Path) -> None:
    """A replay on an engine 25% slower with 5 ms of frontend a request: against the unscaled steps the median
    TTFT residual charges the slower prefills to the frontend (well over 5 ms); against the steps scaled by
    the fitted slowdown it is the 5 ms."""
    sessions = _sessions(8)
    live = run_calibrated(_cal(1.25, frontend_s=0.005), sessions, tmp_path)
    gap = mean_token_gap(live)
    assert gap is not None
    scale = fit_step_scale(gap, lambda s: run_calibrated(_cal(s), sessions, tmp_path)).step_scale
    assert scale == pytest.approx(1.25, rel=0.02)
    unscaled = frontend_latency(live, run_calibrated(_cal(), sessions, tmp_path)).frontend_s
    scaled = frontend_latency(live, run_calibrated(_cal(scale), sessions, tmp_path)).frontend_s
    assert unscaled > 0.006
    assert scaled == pytest.approx(0.005, abs=0.0005)


def test_mean_token_gap_weighs_each_gap_and_the_fit_rejects_what_it_cannot_use() -> None:
    one = RequestRecord("a", 0.0, 0.1, 0.5, 10, 5)  # 4 gaps over 0.4 s
    two = RequestRecord("b", 0.0, 0.1, 0.3, 10, 21)  # 20 gaps over 0.2 s
    single = RequestRecord("c", 0.0, 0.1, 0.1, 10, 1)
    lost = RequestRecord("d", 0.0, None, None, 10, 0, finished=False)
    assert mean_token_gap([one, two, single, lost]) == pytest.approx(0.6 / 24)
    assert mean_token_gap([single, lost]) is None
    with pytest.raises(ValueError, match="no answer of two tokens"):
        fit_step_scale(0.01, lambda _: [single])
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="measured mean token gap must be a finite number > 0"):
            fit_step_scale(bad, lambda _: [one])


def test_step_scale_round_trips_old_files_read_one_and_bad_values_are_refused(tmp_path: Path) -> None:
    cal = dataclasses.replace(_cal(1.17), scale={"gap_source": "engine"})
    cal.save(tmp_path / "cal.json")
    back = load_calibration(tmp_path / "cal.json")
    assert back.step_scale == 1.17 and back.scale == {"gap_source": "engine"}
    raw = json.loads((tmp_path / "cal.json").read_text())
    del raw["step_scale"], raw["scale"]  # a file written before the field existed
    (tmp_path / "old.json").write_text(json.dumps(raw))
    old = load_calibration(tmp_path / "old.json")
    assert old.step_scale == 1.0 and old.step_scale_on == "all"
    raw["step_scale_on"] = "prefill"
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"step_scale_on must be one of \('all', 'decode'\), got 'prefill'"):
        load_calibration(tmp_path / "bad.json")
    del raw["step_scale_on"]
    for bad in (0, -0.5, "NaN", "Infinity", "fast"):
        raw["step_scale"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(raw))
        with pytest.raises(ValueError, match=r"bad\.json: malformed calibration .*step_scale must be a finite number > 0"):
            load_calibration(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="step_scale must be a finite number > 0"):
        _cal(float("inf"))
    # A refit has no scale: it was measured against the steps it replaces.
    probes = tuple(Measurement(kind, steps, sum(STEPS.step_time_s(x) for x in steps))
                   for kind, steps in [*(("prefill", prefill_steps(n, 2048)) for n in (32, 128, 512, 1024, 3000)),
                                       *(("decode", (decode_step(b, b * c),)) for b in (1, 4, 16) for c in (128, 1024))])
    assert pool_calibrations([dataclasses.replace(cal, measurements=probes)] * 2).step_scale == 1.0


def test_a_calibrated_model_prices_a_prefill_with_its_calibration_not_the_roofline() -> None:
    """Policies price prefills with ``prefill_time_s``: on a calibrated model that is the calibration's step."""
    cal = calibration(step_scale=1.5)
    model = CalibratedPerfModel(get_model("llama-3.1-8b"), get_gpu("h100"), 1, cal)
    shape = StepShape(prefill_tokens=200, prefill_seqs=1, prefill_attn_pairs=StepShape.chunk_attn_pairs(200, 100),
                      prefill_context_tokens=300)
    assert model.prefill_time_s(200, 100) == cal.step_time_s(shape) == model.step_time_s(shape)
    assert model.prefill_time_s(200, 100) != PerfModel.from_names("llama-3.1-8b", "h100").prefill_time_s(200, 100)
    # AMPD's local chunk: a prefill chunk beside running decodes, priced by the calibration too.
    mixed = dataclasses.replace(shape, decode_seqs=12, decode_context_tokens=40_000)
    assert model.chunk_step_time_s(200, 100, 12, 40_000) == cal.step_time_s(mixed) == model.step_time_s(mixed)
