"""``benchmarks/ampd_tail_bounds.py``: its memory bound holds the KV it says, and bad input exits 2."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tokenomy.perf import PerfModel
from tokenomy.perf.hardware import get_gpu
from tokenomy.sim import SimConfig

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ampd_tail_bounds.py"


@pytest.fixture(scope="module")
def bounds() -> ModuleType:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("ampd_tail_bounds", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPT.parent))


@pytest.mark.parametrize("factor", [1.0, 4 / 3, 2.0])
def test_memory_bound_gpu_holds_factor_times_the_kv_at_the_same_speed(bounds: ModuleType, tmp_path: Path,
                                                                      factor: float) -> None:
    cfg = SimConfig(deployment="ampd", model="llama-3.1-70b", gpu="h100", tp=4, prefill=1, decode=3)
    path = bounds.bigger_kv_gpu(cfg, factor, tmp_path)
    base = PerfModel.from_names(cfg.model, cfg.gpu, cfg.tp)
    big = PerfModel.from_names(cfg.model, path, cfg.tp)
    assert big.kv_capacity_tokens(0.9) == pytest.approx(factor * base.kv_capacity_tokens(0.9), abs=2)
    assert get_gpu(path).hbm_bytes_per_s == get_gpu("h100").hbm_bytes_per_s
    assert big.decode_step_time_s(8, 50_000) == base.decode_step_time_s(8, 50_000)


@pytest.mark.parametrize("argv, message", [
    (["--point", "z"], "unknown point 'z'"),
    (["--rates", "fast"], "error:"),
    (["--kv-factors", "0"], "factors > 0"),
])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(tmp_path / "o.json"), *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.json").exists()
