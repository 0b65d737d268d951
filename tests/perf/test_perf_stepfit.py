"""The step-time model fitted to engine-level timings: exact on its own form, close on a roofline,
robust to noise, and read back from a calibration file by the simulator."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from tokenomy.core import SLO, Session, Turn
from tokenomy.core.step import StepShape
from tokenomy.perf import PerfModel, get_gpu, get_model
from tokenomy.perf.engine_calibration import (
    EngineCalibration,
    EngineLimits,
    load_calibration,
    pool_calibrations,
)
from tokenomy.perf.stepfit import (
    Measurement,
    StepCoefficients,
    decode_step,
    fit_steps,
    mixed_step,
    prefill_steps,
    score,
)
from tokenomy.sim import SimConfig, simulate

CPU_LIKE = StepCoefficients(fixed_s=4e-3, token_s=2.5e-6, prefill_seq_s=8e-3, decode_seq_s=1e-4, pair_s=6e-8,
                            context_s=2e-7)
GPU_LIKE = StepCoefficients(fixed_s=3e-3, floor_s=5e-3, token_s=1.7e-5, prefill_seq_s=1e-3, decode_seq_s=2e-5,
                            pair_s=1e-10, context_s=3e-8)


def probes(truth: object, chunk: int = 2048) -> list[Measurement]:
    """What `tokenomy perf profile` measures: prefills at several lengths (some chunked, some after a
    cached prefix), decode steps at several batches and contexts; timed by ``truth.step_time_s``."""
    shapes: list[tuple[str, tuple[StepShape, ...]]] = []
    for n in (32, 128, 512, 1024, 2048, 3000):
        shapes.append(("prefill", prefill_steps(n, chunk)))
    shapes.append(("prefill", prefill_steps(1040, chunk, cached_tokens=1024)))
    for ctx in (128, 1024, 3000):
        for b in (1, 4, 16, 32, 64):
            shapes.append(("decode", (decode_step(b, b * ctx),)))
    return [Measurement(k, s, sum(truth.step_time_s(x) for x in s)) for k, s in shapes]  # type: ignore[attr-defined]


@pytest.mark.parametrize("truth", [CPU_LIKE, GPU_LIKE], ids=["cpu-like", "gpu-like"])
def test_fit_recovers_coefficients_of_its_own_form(truth: StepCoefficients) -> None:
    fit = fit_steps(probes(truth))
    assert fit.mape < 1e-6
    for name, want in truth.to_dict().items():
        assert getattr(fit.coefficients, name) == pytest.approx(want, rel=1e-4, abs=1e-12), name


def test_fit_stays_close_under_timing_noise() -> None:
    rng = np.random.default_rng(0)
    noisy = [Measurement(m.kind, m.steps, m.time_s * float(rng.uniform(0.9, 1.1))) for m in probes(CPU_LIKE)]
    fit = fit_steps(noisy)
    held_out = [Measurement("prefill", prefill_steps(700, 2048), 1.0), Measurement("decode", (decode_step(8, 8 * 600),), 1.0)]
    for m in held_out:
        truth = sum(CPU_LIKE.step_time_s(s) for s in m.steps)
        got = sum(fit.coefficients.step_time_s(s) for s in m.steps)
        assert got == pytest.approx(truth, rel=0.1)


def test_mixed_probes_pull_the_fit_to_what_mixed_steps_took() -> None:
    """An engine whose mixed step (a chunk joining a decode batch) costs the chunk alone plus the
    decode step alone, which the model's one shared fixed cost underprices: a fit on pure probes
    prices such steps low; with mixed probes the fit prices them as measured (its ``mixed_s`` term)."""
    def alone(batch: int, ctx: int, n: int) -> float:
        return CPU_LIKE.step_time_s(prefill_steps(ctx + n, 2048, ctx)[0]) + CPU_LIKE.step_time_s(decode_step(batch, batch * ctx))

    pure = probes(CPU_LIKE)
    shapes = [(b, ctx, n) for b in (2, 4) for ctx in (128, 1024) for n in (64, 256)]
    mixed = [Measurement("mixed", (mixed_step(prefill_steps(ctx + n, 2048, ctx)[0], b, b * ctx),), alone(b, ctx, n))
             for b, ctx, n in shapes]
    assert mixed[0].steps[0].prefill_tokens == 64 and mixed[0].steps[0].decode_seqs == 2
    held_out = Measurement("mixed", (mixed_step(prefill_steps(600 + 160, 2048, 600)[0], 3, 3 * 600),), alone(3, 600, 160))
    without, with_mixed = score(fit_steps(pure).coefficients, [held_out]), score(fit_steps(pure + mixed).coefficients, [held_out])
    assert without.mape > 0.05  # pure probes alone miss the mixed step by its whole fixed cost
    assert with_mixed.mape < 0.01, with_mixed.coefficients


def test_fit_approximates_the_roofline_of_a_gpu() -> None:
    """Profiling an H100 running Llama-3.1-8B (our roofline model stands in for it): the fitted
    model prices held-out shapes, mixed batches included, within 10%."""
    pm = PerfModel.from_names("llama-3.1-8b", "h100")
    fit = fit_steps(probes(pm, chunk=8192))
    assert fit.coefficients.floor_s > 0  # small decode batches are weight-read bound
    held_out = [StepShape(prefill_tokens=1500, prefill_seqs=1, prefill_attn_pairs=StepShape.chunk_attn_pairs(1500, 0),
                          prefill_context_tokens=1500),
                decode_step(8, 8 * 2000), decode_step(48, 48 * 500),
                StepShape(prefill_tokens=512, prefill_seqs=1, prefill_attn_pairs=StepShape.chunk_attn_pairs(512, 1000),
                          prefill_context_tokens=1512, decode_seqs=20, decode_context_tokens=20 * 1500)]
    for shape in held_out:
        assert fit.coefficients.step_time_s(shape) == pytest.approx(pm.step_time_s(shape), rel=0.10), shape


def test_prefill_steps_chunk_a_prompt_after_its_cached_prefix() -> None:
    steps = prefill_steps(5000, 2048, cached_tokens=256)
    assert [s.prefill_tokens for s in steps] == [2048, 2048, 648]
    assert [s.prefill_context_tokens for s in steps] == [2304, 4352, 5000]
    assert steps[1].prefill_attn_pairs == StepShape.chunk_attn_pairs(2048, 2304)
    assert all(s.prefill_seqs == 1 and s.decode_seqs == 0 for s in steps)


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="at least 8 measurements"):
        fit_steps(probes(CPU_LIKE)[:3])
    with pytest.raises(ValueError, match="> 0"):
        Measurement("prefill", prefill_steps(10, 10), 0.0)
    with pytest.raises(ValueError, match="at least one engine step"):
        Measurement("decode", (), 1.0)
    with pytest.raises(ValueError, match="token_s"):
        StepCoefficients(token_s=-1.0)
    with pytest.raises(ValueError, match="cached_tokens < prompt_tokens"):
        prefill_steps(10, 4, cached_tokens=10)
    with pytest.raises(ValueError, match="no measurements"):
        score(CPU_LIKE, [])


def _calibration(tmp_path: Path) -> Path:
    fit = fit_steps(probes(CPU_LIKE))
    cal = EngineCalibration(step=fit.coefficients, engine=EngineLimits(block_size_tokens=128, num_gpu_blocks=40,
                                                                       max_num_batched_tokens=2048, max_num_seqs=8),
                            target="http://x", model="tiny", fit=fit.summary(), measurements=tuple(probes(CPU_LIKE)))
    path = tmp_path / "cal.json"
    cal.save(path)
    return path


def _profiled(speed: float, model: str = "tiny") -> EngineCalibration:
    """A profile of a CPU_LIKE engine taken while the machine ran at ``speed`` times its mean step time."""
    measured = tuple(Measurement(m.kind, m.steps, m.time_s * speed) for m in probes(CPU_LIKE))
    fit = fit_steps(measured)
    return EngineCalibration(step=fit.coefficients, engine=EngineLimits(max_num_batched_tokens=2048), target="http://x",
                             model=model, fit={**fit.summary(), "repeat_spread": 0.1 * speed}, measurements=measured)


def test_pooled_profiles_price_the_mean_of_a_drifting_machine() -> None:
    """A profile before a run on a machine 20% slow and one after it 20% fast: each alone prices every step
    20% off; pooled they price the machine's mean within 2%, on shapes neither profile measured (a fit on
    both sets of points side by side would lean to the fast one: its errors are relative)."""
    before, after = _profiled(1.2), _profiled(0.8)
    after = dataclasses.replace(after, measurements=after.measurements[1:])  # a probe the second profile skipped
    pooled = pool_calibrations([before, after])
    assert len(pooled.measurements) == len(before.measurements)  # one per probe
    assert pooled.measurements[0] == before.measurements[0]
    assert pooled.fit["profiles"] == 2 and pooled.fit["repeat_spread"] == [pytest.approx(0.12), pytest.approx(0.08)]
    assert pooled.engine == before.engine and pooled.model == "tiny"
    for shape in (decode_step(1, 300), decode_step(8, 8 * 600), *prefill_steps(700, 2048)):
        truth = CPU_LIKE.step_time_s(shape)
        assert before.step.step_time_s(shape) == pytest.approx(1.2 * truth, rel=1e-3)
        assert pooled.step.step_time_s(shape) == pytest.approx(truth, rel=0.02)


def test_pooling_refuses_nothing_and_other_models() -> None:
    with pytest.raises(ValueError, match="no calibrations"):
        pool_calibrations([])
    with pytest.raises(ValueError, match="different models"):
        pool_calibrations([_profiled(1.0), _profiled(1.0, model="other")])


def test_a_calibration_file_round_trips(tmp_path: Path) -> None:
    path = _calibration(tmp_path)
    cal = load_calibration(path)
    assert cal.step == fit_steps(probes(CPU_LIKE)).coefficients
    assert cal.engine.block_size_tokens == 128 and len(cal.measurements) == len(probes(CPU_LIKE))
    assert fit_steps(cal.measurements).coefficients == cal.step  # refittable from the file alone
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something-else"}))
    raw = json.loads(path.read_text())
    raw["step"]["nope_s"] = 1.0
    (tmp_path / "unknown.json").write_text(json.dumps(raw))
    for name, message in (("bad.json", "not valid JSON"), ("other.json", "tokenomy.perf-calibration/1"),
                          ("unknown.json", "nope_s"), ("missing.json", "cannot read")):
        with pytest.raises(ValueError, match=message):
            load_calibration(tmp_path / name)


def test_the_simulator_runs_the_profiled_engine(tmp_path: Path) -> None:
    """One request alone: its TTFT is the calibrated prefill and its steps the calibrated decode;
    the engine runs the calibration's block size and KV blocks."""
    path = _calibration(tmp_path)
    cal = load_calibration(path)
    model = get_model("llama-3.1-8b")
    pm = cal.perf_model(model, get_gpu("h100"))
    assert pm.kv_capacity_tokens() == 40 * 128
    times, _ = pm.decode_run(4, 1000, 3)
    assert times == [cal.step.step_time_s(decode_step(4, 1000 + 4 * j)) for j in range(3)]
    session = Session("s", 0.0, (Turn(prompt_tokens=3000, output_tokens=5),))
    result = simulate([session], SimConfig(instances=1, calibration=str(path)), SLO())
    assert result.config.block_size_tokens == 128 and result.config.max_num_batched_tokens == 2048
    (rec,) = result.records
    want = sum(cal.step.step_time_s(s) for s in prefill_steps(3000, 2048))
    assert rec.first_token_s == pytest.approx(want, rel=1e-9)
    too_big = Session("t", 0.0, (Turn(prompt_tokens=6000, output_tokens=5),))
    assert simulate([too_big], SimConfig(instances=1, calibration=str(path)), SLO()).records == []
