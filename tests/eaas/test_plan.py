from __future__ import annotations

import pytest

from tokenomy.eaas.plan import compare_scaling, diurnal_curve


def test_diurnal_curve_spans_trough_to_peak() -> None:
    d = diurnal_curve(1000, trough_fraction=0.25, hours=24, step_h=0.5, peak_hour=14)
    assert len(d) == 48
    assert max(d) == pytest.approx(1000, rel=1e-2) and min(d) == pytest.approx(250, rel=1e-2)
    assert d.index(max(d)) in (27, 28)  # the 13:30-14:30 steps


def test_units_round_up_in_whole_units_and_elastic_in_single_gpus() -> None:
    c = compare_scaling([100.0, 330.0, 640.0], step_h=1.0, unit_gpus=320)
    assert c.unit_gpus == (320, 640, 640) and c.elastic_gpus == (100, 330, 640)
    assert c.static_gpus == 640
    assert (c.elastic_gpu_hours, c.unit_gpu_hours, c.static_gpu_hours) == (1070, 1600, 1920)
    assert c.saving_vs_unit == pytest.approx(1 - 1070 / 1600)


def test_headroom_and_coarser_elastic_steps() -> None:
    c = compare_scaling([100.0], unit_gpus=320, elastic_step_gpus=8, headroom_fraction=0.1)
    assert c.elastic_gpus == (112,) and c.unit_gpus == (320,)


def test_a_diurnal_day_saves_gpu_hours_over_unit_scaling() -> None:
    c = compare_scaling(diurnal_curve(960, 0.3))
    assert 0.1 < c.saving_vs_unit < c.saving_vs_static < 0.5


@pytest.mark.parametrize(
    "kwargs", [{"demand_gpus": []}, {"demand_gpus": [-1.0]}, {"demand_gpus": [1.0], "unit_gpus": 0}]
)
def test_bad_inputs_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        compare_scaling(**kwargs)  # type: ignore[arg-type]
