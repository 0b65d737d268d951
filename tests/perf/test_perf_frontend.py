"""The calibration's frontend latency (``frontend_s``): a per-request latency outside the engine's
steps, measured from a replay against its simulation and added by the simulator to every TTFT."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from helpers.calibrated_sim import STEPS, calibration, run_calibrated, three_turn_sessions
from tokenomy.core import Session
from tokenomy.perf.engine_calibration import (
    EngineCalibration,
    frontend_latency,
    load_calibration,
    pool_calibrations,
)
from tokenomy.perf.stepfit import Measurement, decode_step, prefill_steps


def _cal(frontend_s: float = 0.0) -> EngineCalibration:
    return calibration(frontend_s)


def _sessions(n: int) -> list[Session]:
    """``n`` agent-like sessions of three turns, 0.3 s apart, with 0.5 s of tool time between turns."""
    return three_turn_sessions(n, 0.3, 0.5, (20, 20, 20))


def test_the_simulator_adds_the_frontend_latency_to_every_ttft_and_nothing_to_tpot(tmp_path: Path) -> None:
    """One session alone: each turn's TTFT grows by exactly frontend_s (the engine sees the request that much
    later), its token gaps do not move, and the next turn starts that much later."""
    (session,) = _sessions(1)
    plain, slow = run_calibrated(_cal(), [session], tmp_path), run_calibrated(_cal(0.006), [session], tmp_path)
    assert len(plain) == len(slow) == 3
    for a, b in zip(sorted(plain, key=lambda r: r.turn), sorted(slow, key=lambda r: r.turn), strict=True):
        assert b.ttft_s == pytest.approx(a.ttft_s + 0.006, abs=1e-12)
        assert b.tpot_s == pytest.approx(a.tpot_s, abs=1e-12)
        assert b.arrival_s == pytest.approx(a.arrival_s + 0.006 * a.turn, abs=1e-12)


def test_frontend_latency_is_the_median_residual_matched_by_session_and_turn(tmp_path: Path) -> None:
    """A 'live' replay that is the simulation with 5 ms of frontend per request and one stalled turn: the
    median residual recovers the 5 ms (the stall does not set it); records are matched by session and turn,
    not by order; a replay faster than the model gives 0, not a negative latency."""
    sessions = _sessions(6)
    base = run_calibrated(_cal(), sessions, tmp_path)
    live = run_calibrated(_cal(0.005), sessions, tmp_path)
    stalled = dataclasses.replace(live[3], first_token_s=live[3].first_token_s + 0.4)  # type: ignore[operator]
    live = list(reversed([*live[:3], stalled, *live[4:]]))
    fit = frontend_latency(live, base)
    assert fit.frontend_s == pytest.approx(0.005, abs=1e-9) and fit.requests == len(base) == 18
    assert frontend_latency(base, live).frontend_s == 0.0
    assert frontend_latency(base, live).median_residual_s == pytest.approx(-0.005, abs=1e-9)
    # The simulation with the measured latency reproduces the 'live' TTFTs it was measured on.
    again = {(r.session_id, r.turn): r.ttft_s for r in run_calibrated(_cal(fit.frontend_s), sessions, tmp_path)}
    assert all(again[(r.session_id, r.turn)] == pytest.approx(r.ttft_s, abs=1e-9) for r in run_calibrated(_cal(0.005), sessions, tmp_path))


def test_frontend_latency_needs_requests_on_both_sides(tmp_path: Path) -> None:
    base = run_calibrated(_cal(), _sessions(1), tmp_path)
    other = [dataclasses.replace(r, session_id="elsewhere") for r in base]
    unfinished = [dataclasses.replace(r, finished=False, first_token_s=None, finish_s=None) for r in base]
    for measured in (other, unfinished, []):
        with pytest.raises(ValueError, match="no request finished on both sides"):
            frontend_latency(measured, base)


def test_frontend_latency_round_trips_and_old_files_read_zero(tmp_path: Path) -> None:
    cal = dataclasses.replace(_cal(0.0042), frontend={"requests": 60})
    cal.save(tmp_path / "cal.json")
    back = load_calibration(tmp_path / "cal.json")
    assert back.frontend_s == 0.0042 and back.frontend == {"requests": 60}
    raw = json.loads((tmp_path / "cal.json").read_text())
    del raw["frontend_s"], raw["frontend"]  # a file written before the term existed
    (tmp_path / "old.json").write_text(json.dumps(raw))
    assert load_calibration(tmp_path / "old.json").frontend_s == 0.0
    for bad in (-0.001, float("nan")):
        raw["frontend_s"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(raw))
        with pytest.raises(ValueError, match="frontend_s must be a finite number >= 0"):
            load_calibration(tmp_path / "bad.json")
    # A refit has no frontend latency: it was measured against the steps it replaces.
    probes = tuple(Measurement(kind, steps, sum(STEPS.step_time_s(x) for x in steps))
                   for kind, steps in [*(("prefill", prefill_steps(n, 2048)) for n in (32, 128, 512, 1024, 3000)),
                                       *(("decode", (decode_step(b, b * c),)) for b in (1, 4, 16) for c in (128, 1024))])
    assert pool_calibrations([dataclasses.replace(cal, measurements=probes)] * 2).frontend_s == 0.0
