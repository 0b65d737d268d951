from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from tokenomy.core import SLO
from tokenomy.metrics import Summary, summarize
from tokenomy.metrics.report import plot_comparison, plot_sweep, render_table, write_json

from .factories import make_record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _summaries() -> dict[str, Summary]:
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    fast = [make_record(f"f{i}", ttft_s=0.25, tpot_s=0.02, prompt_tokens=1000) for i in range(4)]
    slow = [make_record("s0", ttft_s=1.5, tpot_s=0.05), make_record("s1", ttft_s=0.5, finished=False)]
    return {
        "pd": summarize(fast, slo=slo, duration_s=10.0, num_gpus=2, usd_per_gpu_hour=3.6),
        "colocated": summarize(slow, slo=slo, duration_s=10.0, num_gpus=2, usd_per_gpu_hour=3.6),
    }


def test_render_table_shows_the_numbers() -> None:
    out = StringIO()
    console = Console(file=out, width=200, color_system=None)
    render_table(_summaries(), console=console, title="demo run")
    text = out.getvalue()
    for needle in ("demo run", "pd", "colocated", "TTFT P50 (ms)", "250.0", "1490.0", "20.0",
                   "100.0%", "0.0%", "cost per M tokens", "tokens: input_tokens", "4,000"):
        assert needle in text, needle


def _row(text: str, label: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if label in ln)
    return [c.strip() for c in line.split("│")[2:-1]]


def test_cost_and_mfu_say_n_a_when_no_price_or_peak_was_given() -> None:
    """``tokenomy bench`` without --usd-per-gpu-hour printed cost 0.0000 and MFU 0.0%: free and idle.
    Unknown is "n/a"; given a price and a peak, the numbers come back."""
    recs = [make_record(f"r{i}", ttft_s=0.25, tpot_s=0.02, prompt_tokens=1000) for i in range(4)]
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    unknown = summarize(recs, slo=slo, duration_s=10.0, num_gpus=1, usd_per_gpu_hour=0.0)
    known = summarize(recs, slo=slo, duration_s=10.0, num_gpus=1, usd_per_gpu_hour=3.6,
                      total_flops=1e15, peak_flops_per_s=1e15)
    assert unknown.cost_per_mtok_usd is None and unknown.mfu is None
    out = StringIO()
    render_table({"bench": unknown, "priced": known}, console=Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert _row(text, "cost per M tokens ($)")[0] == "n/a"
    assert _row(text, "cost per M output tokens ($)")[0] == "n/a"
    assert _row(text, "MFU")[0] == "n/a"
    assert _row(text, "MFU")[1] == "10.0%"
    assert float(_row(text, "cost per M tokens ($)")[1]) == pytest.approx(0.01 / known.tpm * 60 * 1e6 / 10, rel=1e-3)


def test_render_table_of_empty_summary_shows_dashes() -> None:
    out = StringIO()
    render_table({"idle": Summary()}, console=Console(file=out, width=120, color_system=None))
    assert "TTFT P99 (ms)" in out.getvalue() and " - " in out.getvalue()


def test_write_json_round_trip_is_atomic_and_strict(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "run.json"
    payload = {"deployments": _summaries(), "empty": Summary()}
    write_json(target, payload)
    loaded = json.loads(target.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert loaded["deployments"]["pd"]["slo_attainment"] == 1.0
    assert loaded["empty"]["ttft_p50_s"] is None
    assert [p.name for p in target.parent.iterdir()] == ["run.json"]  # no temp file left behind


def test_write_json_refuses_nan_and_keeps_old_file(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    write_json(target, {"ok": 1})
    with pytest.raises(ValueError, match="NaN or infinity"):
        write_json(target, {"bad": float("nan")})
    assert json.loads(target.read_text()) == {"ok": 1}


def test_plots_write_png_files(tmp_path: Path) -> None:
    cmp_path = plot_comparison(_summaries(), tmp_path / "plots" / "cmp.png")
    sweep_path = plot_sweep([1, 2, 4], {"pd": [1.0, 0.95, 0.6], "colocated": [0.9, 0.5, 0.1]},
                            tmp_path / "sweep.png", ylabel="SLO attainment")
    for path in (cmp_path, sweep_path):
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000


def test_plot_sweep_rejects_mismatched_series(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'pd' has 2 points but there are 3 rates"):
        plot_sweep([1, 2, 3], {"pd": [1.0, 0.5]}, tmp_path / "x.png")
