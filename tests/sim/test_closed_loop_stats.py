"""The closed-loop benchmark's statistics: goodput over a fixed window, cells pooled into one
fleet, the simulated figure as the mean of its draws, and the live-minus-simulated check."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tokenomy.core import SLO, RequestRecord
from tokenomy.metrics import summarize

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SLO_2S = SLO(ttft_s=2.0, tpot_s=0.1)


@pytest.fixture(scope="module")
def stats() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import closed_loop_stats

        yield closed_loop_stats
    finally:
        sys.path.remove(str(BENCHMARKS))


def _rec(i: int, tier: str, arrival: float, ttft: float, finish: float) -> RequestRecord:
    return RequestRecord(f"r{i}", arrival, arrival + ttft, finish, 100, 11, tier=tier, tenant=tier)


def _figures(stats: ModuleType, recs: list[RequestRecord], window_s: float) -> dict:
    summary = summarize(recs, slo=SLO_2S, duration_s=max(r.finish_s or 0.0 for r in recs), num_gpus=2,
                        usd_per_gpu_hour=0.0)
    return stats.figures(summary, recs, SLO_2S, window_s)


def test_goodput_counts_slo_met_requests_finished_within_the_fixed_window(stats: ModuleType) -> None:
    recs = [_rec(0, "gold", 0.0, 0.5, 1.0),      # met, inside
            _rec(1, "gold", 10.0, 3.0, 14.0),    # TTFT missed
            _rec(2, "free", 20.0, 0.2, 21.0),    # met, inside
            _rec(3, "free", 100.0, 0.2, 100.6)]  # met, after the window
    f = _figures(stats, recs, window_s=100.0)
    assert f["slo_met"] == 3 and f["slo_met_after_window"] == 1
    assert f["goodput_rps"] == pytest.approx(2 / 100.0)
    assert f["attainment_by_tier"] == {"free": 1.0, "gold": 0.5}
    assert f["end_s"] == 100.6


def test_cells_pool_as_one_fleet_and_keep_the_last_finish_goodput_per_cell(stats: ModuleType) -> None:
    a = _figures(stats, [_rec(0, "gold", 0.0, 0.5, 1.0)] * 3 + [_rec(1, "free", 0.0, 3.0, 9.0)], 100.0)
    b = _figures(stats, [_rec(2, "free", 0.0, 0.5, 1.0)], 100.0)
    for f in (a, b):
        stats.common_goodput({"blind": f}, ["blind"])
    fleet = stats.pool([a, b])
    # met over offered across the cells, not the mean of the cells' attainments (0.0 and 1.0)
    assert fleet["attainment_by_tier"] == {"free": 0.5, "gold": 1.0}
    assert fleet["goodput_rps"] == pytest.approx(a["goodput_rps"] + b["goodput_rps"])
    assert fleet["goodput_rps_last_finish"] == pytest.approx(3 / 9.0 + 1 / 1.0, abs=1e-4)
    assert fleet["requests"] == 5 and fleet["end_s"] == 9.0 and len(fleet["cells"]) == 2


def test_live_is_held_to_the_mean_of_the_simulated_draws(stats: ModuleType) -> None:
    rows = {m: [{"attainment.gold": g, "goodput_rps": r, "goodput_rps_last_finish": r, "slo_met": 0.0,
                 "requests": 1.0} for g, r in ((0.70, 2.0), (0.80, 3.0), (0.90, 4.0))] for m in ("blind",)}
    sim = {"blind": stats.draws_mean(rows["blind"])}
    assert sim["blind"]["attainment_by_tier"] == {"gold": pytest.approx(0.8)}
    assert sim["blind"]["spread"]["goodput_rps"] == {"min": 2.0, "max": 4.0, "sd": 1.0}
    near = {"blind": {"attainment_by_tier": {"gold": 0.87}, "goodput_rps": 3.2}}
    far = {"blind": {"attainment_by_tier": {"gold": 0.89}, "goodput_rps": 3.0}}
    assert stats.within(stats.gaps(near, sim, ["blind"], "goodput_rps"))
    gap = stats.gaps(far, sim, ["blind"], "goodput_rps")
    assert gap["blind.attainment.gold"] == pytest.approx(0.09) and not stats.within(gap)
