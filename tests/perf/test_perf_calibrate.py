"""Calibration against Vidur profiles: the fitted model beats the roofline on held-out points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import main
from tokenomy.perf.calibrate import Calibration, calibrate, sample_cost
from tokenomy.perf.coefficients import Coefficients, load_coefficients
from tokenomy.perf.hardware import get_gpu
from tokenomy.perf.ops import op_time_s
from tokenomy.perf.profiles import LayerShape, OperatorSample, read_operator_samples

PROFILES = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "profiles" / "vidur"
needs_profiles = pytest.mark.skipif(not (PROFILES / "compute").is_dir(),
                                    reason=f"shared Vidur profiles not found at {PROFILES}")

_HEADER = ["time_stats.mlp_up_proj.median", "time_stats.add.median", "n_head", "n_kv_head", "n_embd",
           "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens", "num_tensor_parallel_workers"]


def _tiny_profiles(root: Path) -> Path:
    """A synthetic profile whose times come from known coefficients."""
    folder = root / "compute" / "h100" / "org" / "tiny"
    folder.mkdir(parents=True)
    truth = Coefficients(compute_efficiency=0.6, memory_efficiency=0.8, gemm_latency_s=8e-6,
                         add_efficiency=0.9, elementwise_latency_s=3e-6)
    rows = [",".join(_HEADER)]
    for tp in (1, 2):
        for tokens in (1, 8, 64, 256, 1024, 4096, 16, 32, 128, 512, 2048, 3072):
            values = []
            for op in ("mlp_up_proj", "add"):
                s = OperatorSample("H100-SXM", "org/tiny", op, LayerShape(32, 8, 4096, 14336, 32000, True),
                                   tokens, tp, 0.0)
                values.append(op_time_s(sample_cost(s), tokens, get_gpu("h100"), truth) * 1e3)
            rows.append(f"{values[0]},{values[1]},32,8,4096,14336,32000,True,{tokens},{tp}")
    (folder / "mlp.csv").write_text("\n".join(rows) + "\n")
    return root


def test_fit_recovers_known_coefficients(tmp_path: Path) -> None:
    cal = calibrate(_tiny_profiles(tmp_path))
    fitted = cal.coefficients["H100-SXM"]
    assert fitted.compute_efficiency == pytest.approx(0.6, rel=0.02)
    assert fitted.memory_efficiency == pytest.approx(0.8, rel=0.02)
    assert fitted.add_efficiency == pytest.approx(0.9, rel=0.02)
    summary = cal.summary()
    assert summary["mape_fitted"] < 0.01 < summary["mape_roofline"]


def test_reader_converts_ms_to_seconds(tmp_path: Path) -> None:
    samples = read_operator_samples(_tiny_profiles(tmp_path))
    assert {s.op for s in samples} == {"mlp_up_proj", "add"}
    assert all(0 < s.time_s < 0.01 for s in samples)


@pytest.mark.parametrize("make", ["absent", "empty"])
def test_missing_profiles_are_a_clear_error(tmp_path: Path, make: str) -> None:
    root = tmp_path / "profiles"
    if make == "empty":
        root.mkdir()
    with pytest.raises(FileNotFoundError, match="profiles|mlp.csv"):
        calibrate(root)


def test_cli_validate_missing_dir_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "validate", "--profiles", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_cli_fit_writes_loadable_coefficients(tmp_path: Path) -> None:
    out = tmp_path / "coeffs.json"
    assert main(["perf", "fit", "--profiles", str(_tiny_profiles(tmp_path / "p")), "--out", str(out)]) == 0
    assert load_coefficients(out)["H100-SXM"].compute_efficiency == pytest.approx(0.6, rel=0.02)


@pytest.mark.parametrize(("args", "expect"), [
    (["--model", "llama-3.1-8b", "--gpu", "h100"], "131,072"),
    (["--model", "Llama-3.1-70B", "--gpu", "h100", "--tp", "2"], "KV capacity"),
    (["--model", "deepseek-v3", "--gpu", "h200", "--tp", "16"], "KV transfer"),
])
def test_cli_show(args: list[str], expect: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "show", *args]) == 0
    assert expect in capsys.readouterr().out


def test_cli_show_exits_2_with_the_shortfall_when_the_model_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "show", "--model", "Llama-3.1-70B", "--gpu", "h100"]) == 2
    assert "need tp >= 2; short by 65.9 GB" in capsys.readouterr().err


def test_cli_show_unknown_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "show", "--model", "llama-3.1-8b", "--gpu", "tpu"]) == 2
    assert "known:" in capsys.readouterr().err


@pytest.fixture(scope="module")
def shared_calibration() -> Calibration:
    return calibrate(PROFILES)


@needs_profiles
def test_fitted_model_meets_15_percent_on_held_out_points(shared_calibration: Calibration) -> None:
    summary = shared_calibration.summary()
    assert summary["points"] > 10_000
    assert summary["mape_fitted"] <= 0.15 < summary["mape_roofline"]
    for gpu in shared_calibration.validation:
        assert gpu.gpu in ("H100-SXM", "A100-80GB")
        assert gpu.mape_fitted <= 0.15 and gpu.mape_fitted < gpu.mape_roofline
        assert gpu.layer_mape_fitted <= 0.10
        assert gpu.allreduce_mape_fitted <= 0.2


@needs_profiles
def test_shipped_coefficients_match_a_fresh_fit(shared_calibration: Calibration) -> None:
    shipped = load_coefficients(Path(__file__).resolve().parents[2] / "src" / "tokenomy" / "perf" / "coefficients.json")
    for gpu, fitted in shared_calibration.coefficients.items():
        assert shipped[gpu].compute_efficiency == pytest.approx(fitted.compute_efficiency, rel=1e-3)


@needs_profiles
def test_cli_validate_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "v.json"
    assert main(["perf", "validate", "--profiles", str(PROFILES), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"mape_roofline", "mape_fitted", "points", "per_gpu"} <= set(result)
    assert result["mape_fitted"] <= 0.15
    assert "roofline" in capsys.readouterr().out
