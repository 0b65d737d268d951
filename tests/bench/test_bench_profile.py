"""`tokenomy perf profile` end to end against our emulator, whose true step times we know: the
emulator prices every step with the roofline model, so the fitted calibration must reproduce it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.launch import emulator
from helpers.ports import free_port_base
from tokenomy.cli.main import main
from tokenomy.perf import PerfModel
from tokenomy.perf.engine_calibration import load_calibration
from tokenomy.perf.stepfit import decode_step, prefill_steps

SLOW = 3.0
"""Wall seconds per modelled second of the profiled emulator."""


@pytest.fixture(scope="module")
def emulator_url() -> Iterator[str]:
    # Modelled time runs SLOW times slower than the wall clock, so the HTTP and tokenizing work a
    # client also times (and a busy test machine's hiccups) stay small next to the steps.
    with emulator("--log-level", "warning", "--time-scale", str(SLOW)) as url:
        yield url


@pytest.mark.integration
def test_profile_recovers_the_emulators_step_times(emulator_url: str, tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    rc = main(["perf", "profile", "--target", emulator_url, "--out", str(out), "--prompt-tokens", "64,512,2048,8192",
               "--batches", "1,8,32", "--contexts", "256,2048", "--decode-tokens", "24", "--repeats", "1",
               "--mixed-tails", "128", "--mixed-batches", "4",
               "--seed", "1", "--quiet"])
    assert rc == 0
    cal = load_calibration(out)
    # The engine's limits come from the emulator itself.
    assert cal.engine.block_size_tokens == 16 and cal.engine.max_num_batched_tokens == 8192
    assert cal.engine.num_gpu_blocks and cal.engine.max_model_len == 131_072  # Llama-3.1-8B's own window
    assert cal.model == "llama-3.1-8b" and cal.fit["points"] == len(cal.measurements) >= 10
    # Decode steps come from the emulator's inter-token histogram, scaled by its time scale to wall time.
    assert cal.fit["decode_timing"] == {"engine": 6, "client": 0}
    truth = PerfModel.from_names("llama-3.1-8b", "h100")
    # A 128-token chunk after each cached context while 4 streams decode on it: one mixed step each,
    # timed within half a decode step of the emulator's own price (one round: the chunk's random
    # moment in the step it waited for is not averaged out).
    mixed = [m for m in cal.measurements if m.kind == "mixed"]
    assert len(mixed) == 2
    for m in mixed:
        (step,) = m.steps
        assert step.prefill_tokens == 128 and step.prefill_seqs == 1 and step.decode_seqs == 4
        decode_alone = truth.step_time_s(decode_step(4, step.decode_context_tokens)) * SLOW
        assert abs(m.time_s - truth.step_time_s(step) * SLOW) < decode_alone / 2 + 0.005, m
    # Shapes the profile never measured, priced by the fit and by the emulator's own model.
    for steps in (prefill_steps(1000, 8192), prefill_steps(4000, 8192), (decode_step(16, 16 * 1000),),
                  (decode_step(64, 64 * 500),)):
        want = sum(truth.step_time_s(s) for s in steps)
        got = sum(cal.step.step_time_s(s) for s in steps) / SLOW
        assert got == pytest.approx(want, rel=0.2), steps


@pytest.mark.integration
def test_profile_of_an_unreachable_target_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["perf", "profile", "--target", f"http://127.0.0.1:{free_port_base(1)}", "--model", "m", "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "profile request" in err and "connect_error" in err and "Traceback" not in err
    assert main(["perf", "profile", "--target", "ftp://x", "--model", "m"]) == 2
    assert main(["perf", "profile", "--target", "http://x", "--model", "m", "--decode-tokens", "2"]) == 2
