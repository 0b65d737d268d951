"""A small calibrated engine and agent-like sessions, simulated on a calibration file: what the
calibration tests (``frontend_s``, ``step_scale``) replay and measure against."""

from __future__ import annotations

from pathlib import Path

from tokenomy.core import SLO, RequestRecord, Session, Turn
from tokenomy.perf.engine_calibration import EngineCalibration, EngineLimits
from tokenomy.perf.stepfit import StepCoefficients
from tokenomy.sim import SimConfig, simulate

STEPS = StepCoefficients(fixed_s=0.002, token_s=2e-5, prefill_seq_s=0.004, decode_seq_s=1e-4, context_s=1e-7)
"""A CPU-like engine: about 7 ms for a 200-token prefill, 2 ms a decode step."""


def calibration(frontend_s: float = 0.0, step_scale: float = 1.0, on: str = "all") -> EngineCalibration:
    """:data:`STEPS` with vLLM CPU-like limits, the given frontend latency and step scale."""
    return EngineCalibration(step=STEPS, engine=EngineLimits(max_num_batched_tokens=2048, max_num_seqs=16),
                             model="tiny", frontend_s=frontend_s, step_scale=step_scale, step_scale_on=on)


def three_turn_sessions(n: int, spacing_s: float, think_s: float, outputs: tuple[int, int, int]) -> list[Session]:
    """``n`` agent-like sessions of three turns (prompts of 300, 500 and 700 tokens, ``outputs``
    tokens out), ``spacing_s`` apart, ``think_s`` of tool time between turns."""
    return [Session(f"s{i}", spacing_s * i, (Turn(prompt_tokens=300, output_tokens=outputs[0]),
                                             Turn(prompt_tokens=500, output_tokens=outputs[1], think_time_s=think_s),
                                             Turn(prompt_tokens=700, output_tokens=outputs[2], think_time_s=think_s)))
            for i in range(n)]


def run_calibrated(cal: EngineCalibration, sessions: list[Session], tmp_path: Path) -> list[RequestRecord]:
    """``sessions`` simulated on one instance that reads ``cal`` from a file, as a user's run does."""
    path = tmp_path / f"cal-{cal.step_scale}-{cal.frontend_s}-{cal.step_scale_on}.json"
    cal.save(path)
    return simulate(sessions, SimConfig(instances=1, calibration=str(path)), SLO()).records
