"""A measured engine as the simulator's performance model: ``tokenomy perf profile`` writes it,
``tokenomy sim --calibration FILE`` reads it.

The file (JSON, schema ``tokenomy.perf-calibration/1``) holds the fitted step-time coefficients
(:mod:`tokenomy.perf.stepfit`), the engine limits the profiler read from the target (block size,
KV blocks, token budget per step, batch size), the fit's errors and every raw measurement, so a
calibration can be refitted or audited. :class:`CalibratedPerfModel` prices steps with the
fitted coefficients and sizes the KV cache as the engine reported it; everything else (KV bytes
per token, links, prices) stays the catalog model's and GPU's.

``frontend_s`` is a latency every request pays outside the engine's steps, counted in its TTFT
(the simulator hands a request to the engine that long after it arrives): the work a serving
frontend does for a request under a live stream of others (an API server tokenizing, scheduling
its intake among other streams' output, on cores it may share with the engine) beyond what the
profile's probes, one request or one batch at a time, already timed. :func:`frontend_latency`
measures it from a replay of a workload against its simulation on the fitted steps; files
without it read as 0.

``step_scale`` multiplies the fitted step times: how much slower the engine's own steps run while
a live stream keeps its serving frontend busy (on a machine whose cores the engine shares with its
API server and clients) than in the profile's isolated probes. :func:`fit_step_scale` measures it
from a replay's mean token gap against the gap simulated for that replay; ``frontend_s`` is then
measured against the scaled steps, so a slowed engine is not charged to the frontend. Files
without it read as 1. ``step_scale_on`` says which steps it scales: ``"all"`` (the default) or
``"decode"`` (steps that carry no prefill chunk: a slowdown of the per-step overhead a decode step
is made of, where a prefill's compute runs at the profiled speed).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenomy.core.records import RequestRecord
from tokenomy.core.step import StepShape
from tokenomy.perf.coefficients import Coefficients
from tokenomy.perf.hardware import GPUSpec
from tokenomy.perf.model import DEFAULT_ACTIVATION_RESERVE_BYTES, PerfModel
from tokenomy.perf.models import ModelSpec
from tokenomy.perf.stepfit import Measurement, StepCoefficients, fit_steps

SCHEMA = "tokenomy.perf-calibration/1"
STEP_SCALE_ON = ("all", "decode")
"""Which steps ``step_scale`` multiplies: every step, or those that carry no prefill chunk."""


@dataclass(frozen=True)
class EngineLimits:
    """What the profiled engine was configured with (vLLM's names); None: not known."""

    block_size_tokens: int | None = None
    num_gpu_blocks: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"engine {name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class EngineCalibration:
    """One profiled engine: ``step`` coefficients, its ``engine`` limits, the fit's ``fit`` summary
    and the ``measurements`` they came from; ``target`` and ``model`` say what was profiled;
    ``frontend_s`` the per-request latency outside the engine's steps (module docstring) and
    ``frontend`` how it was measured; ``step_scale`` the factor on the step times under a live
    stream, on the steps ``step_scale_on`` names (module docstring), and ``scale`` how it was
    measured."""

    step: StepCoefficients
    engine: EngineLimits = field(default_factory=EngineLimits)
    target: str = ""
    model: str = ""
    fit: dict[str, Any] = field(default_factory=dict)
    measurements: tuple[Measurement, ...] = ()
    frontend_s: float = 0.0
    frontend: dict[str, Any] = field(default_factory=dict)
    step_scale: float = 1.0
    scale: dict[str, Any] = field(default_factory=dict)
    step_scale_on: str = "all"

    def __post_init__(self) -> None:
        if not (self.frontend_s >= 0 and math.isfinite(self.frontend_s)):
            raise ValueError(f"calibration frontend_s must be a finite number >= 0, got {self.frontend_s!r}")
        if not (self.step_scale > 0 and math.isfinite(self.step_scale)):
            raise ValueError(f"calibration step_scale must be a finite number > 0, got {self.step_scale!r}")
        if self.step_scale_on not in STEP_SCALE_ON:
            raise ValueError(f"calibration step_scale_on must be one of {STEP_SCALE_ON}, got {self.step_scale_on!r}")

    def step_time_s(self, shape: StepShape) -> float:
        """One step's time on this engine: the fitted coefficients' price, times ``step_scale`` on the
        steps ``step_scale_on`` names."""
        t = self.step.step_time_s(shape)
        return t if self.step_scale_on == "decode" and shape.prefill_seqs else t * self.step_scale

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "target": self.target, "model": self.model, "step": self.step.to_dict(),
            "engine": {k: v for k, v in self.engine.__dict__.items() if v is not None}, "fit": self.fit,
            "frontend_s": self.frontend_s, "frontend": self.frontend,
            "step_scale": self.step_scale, "step_scale_on": self.step_scale_on, "scale": self.scale,
            "measurements": [{"kind": m.kind, "time_s": m.time_s, "steps": [_shape_dict(s) for s in m.steps]}
                             for m in self.measurements],
        }

    @classmethod
    def from_dict(cls, raw: Any, where: str = "calibration") -> EngineCalibration:
        if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
            raise ValueError(f"{where}: not a {SCHEMA} file (written by `tokenomy perf profile`)")
        try:
            return cls(
                step=StepCoefficients.from_dict(raw["step"]),
                engine=EngineLimits(**raw.get("engine", {})),
                target=str(raw.get("target", "")), model=str(raw.get("model", "")), fit=dict(raw.get("fit", {})),
                measurements=tuple(Measurement(m["kind"], tuple(StepShape(**s) for s in m["steps"]), float(m["time_s"]))
                                   for m in raw.get("measurements", [])),
                frontend_s=float(raw.get("frontend_s", 0.0)), frontend=dict(raw.get("frontend", {})),
                step_scale=_positive_float(raw.get("step_scale", 1.0), "step_scale"), scale=dict(raw.get("scale", {})),
                step_scale_on=str(raw.get("step_scale_on", "all")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: malformed calibration ({exc.__class__.__name__}: {exc})") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    def perf_model(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1) -> CalibratedPerfModel:
        return CalibratedPerfModel(model, gpu, tp, self)


def pool_calibrations(calibrations: Sequence[EngineCalibration]) -> EngineCalibration:
    """One calibration from several profiles of the same engine (e.g. one taken just before and one
    just after a run, so a machine whose speed drifts over minutes is priced at its median over the
    run, not at one moment): each probe (same kind, same steps) at its median over the profiles, a
    probe only some profiles made as it is, fitted anew. Limits, target and model are the first
    profile's; ``fit`` has the pooled fit's errors, ``profiles`` (how many) and each profile's
    ``repeat_spread``. The pool has no ``frontend_s`` and no ``step_scale``: both are measured
    against a fit's steps (:func:`frontend_latency`, :func:`fit_step_scale`), so a refit needs its
    own. ValueError when there are none or they name different models."""
    if not calibrations:
        raise ValueError("no calibrations to pool")
    first = calibrations[0]
    if any(c.model != first.model for c in calibrations):
        raise ValueError(f"cannot pool calibrations of different models: {sorted({c.model for c in calibrations})}")
    probes: dict[tuple[str, tuple[StepShape, ...]], list[float]] = {}
    for c in calibrations:
        for m in c.measurements:
            probes.setdefault((m.kind, m.steps), []).append(m.time_s)
    measurements = tuple(Measurement(kind, steps, statistics.median(times)) for (kind, steps), times in probes.items())
    fit = fit_steps(measurements)
    summary: dict[str, Any] = {**fit.summary(), "profiles": len(calibrations),
                               "repeat_spread": [c.fit.get("repeat_spread") for c in calibrations]}
    return EngineCalibration(step=fit.coefficients, engine=first.engine, target=first.target, model=first.model,
                             fit=summary, measurements=measurements)


@dataclass(frozen=True)
class FrontendFit:
    """What :func:`frontend_latency` found: ``frontend_s`` (the median per-request TTFT residual,
    floored at 0), the ``median_residual_s`` itself, and the ``requests`` it was taken over."""

    frontend_s: float
    median_residual_s: float
    requests: int

    def to_dict(self) -> dict[str, Any]:
        return {"frontend_s": self.frontend_s, "median_residual_s": self.median_residual_s, "requests": self.requests}


def frontend_latency(measured: Sequence[RequestRecord], simulated: Sequence[RequestRecord]) -> FrontendFit:
    """The per-request latency a live run adds outside the engine's steps: the median, over the
    requests both sides finished (matched by session and turn), of measured TTFT less the TTFT
    simulated on the fitted steps with no frontend latency. A median, so a few stalled turns do
    not set it; floored at 0 (a step model that prices requests slow is not fixed by a negative
    latency). ``measured`` must be a run apart from any the calibration is then judged against.
    ValueError when no request is on both sides."""
    sim = {(r.session_id, r.turn): r.ttft_s for r in simulated if r.finished}
    residuals = [t - s for r in measured
                 if r.finished and (t := r.ttft_s) is not None and (s := sim.get((r.session_id, r.turn))) is not None]
    if not residuals:
        raise ValueError("no request finished on both sides: nothing to measure a frontend latency on")
    median = statistics.median(residuals)
    return FrontendFit(frontend_s=max(0.0, median), median_residual_s=median, requests=len(residuals))


def mean_token_gap(records: Sequence[RequestRecord]) -> float | None:
    """Mean gap between consecutive output tokens over the finished answers of more than one token:
    their first-to-last-token time summed over their gaps (each gap weighs the same, as in an
    engine's inter-token histogram); None when no answer has two tokens."""
    span = gaps = 0.0
    for r in records:
        if r.finished and r.output_tokens > 1 and r.first_token_s is not None and r.finish_s is not None:
            span += r.finish_s - r.first_token_s
            gaps += r.output_tokens - 1
    return span / gaps if gaps else None


@dataclass(frozen=True)
class StepScaleFit:
    """What :func:`fit_step_scale` found: the ``step_scale`` at which the replay's simulated mean token
    gap (``simulated_gap_s``) came closest to the ``measured_gap_s``, and every ``(scale, simulated
    gap)`` it ``tried``, the first at scale 1."""

    step_scale: float
    measured_gap_s: float
    simulated_gap_s: float
    tried: tuple[tuple[float, float], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"step_scale": self.step_scale, "measured_gap_s": self.measured_gap_s,
                "simulated_gap_s": self.simulated_gap_s, "tried": [list(t) for t in self.tried]}


def fit_step_scale(measured_gap_s: float, simulate_at: Callable[[float], Sequence[RequestRecord]],
                   tolerance: float = 0.005, max_simulations: int = 8) -> StepScaleFit:
    """The ``step_scale`` at which a replay simulated on the fitted steps (``simulate_at(scale)``: its
    records) has the mean token gap (:func:`mean_token_gap`) the replay measured, ``measured_gap_s``
    (as its engine stamped it, or its client saw). The first guess is measured over simulated gap at
    scale 1; slower steps also batch more requests together, so the gap grows a little faster than
    the scale, and each later guess interpolates between the scales tried on either side of the
    measured gap. Stops within ``tolerance`` of it (relative), or after ``max_simulations``, at the
    closest scale tried. ``measured_gap_s`` must come from a run apart from any the calibration is
    then judged against. ValueError when it is not a finite number > 0 or a simulation has no answer
    of two tokens."""
    if not (measured_gap_s > 0 and math.isfinite(measured_gap_s)):
        raise ValueError(f"a measured mean token gap must be a finite number > 0, got {measured_gap_s!r}")
    tried: list[tuple[float, float]] = []
    scale = 1.0
    for _ in range(max(1, max_simulations)):
        gap = mean_token_gap(simulate_at(scale))
        if not gap:
            raise ValueError("the simulated replay has no answer of two tokens: nothing to scale the steps by")
        tried.append((scale, gap))
        if abs(gap / measured_gap_s - 1) <= tolerance:
            break
        below = max((t for t in tried if t[1] < measured_gap_s), default=None)
        above = min((t for t in tried if t[1] > measured_gap_s), default=None)
        if below is None or above is None or above[0] <= below[0]:
            scale *= measured_gap_s / gap  # no bracket yet: step by the ratio
        else:
            scale = below[0] + (measured_gap_s - below[1]) * (above[0] - below[0]) / (above[1] - below[1])
            if above[0] - below[0] <= tolerance * scale:
                break
    best = min(tried, key=lambda t: abs(t[1] / measured_gap_s - 1))
    return StepScaleFit(step_scale=best[0], measured_gap_s=measured_gap_s, simulated_gap_s=best[1], tried=tuple(tried))


def _shape_dict(s: StepShape) -> dict[str, float]:
    return {k: getattr(s, k) for k in StepShape.__slots__ if getattr(s, k)}


def _positive_float(value: Any, name: str) -> float:
    """``value`` as a finite float > 0; ValueError naming ``name`` otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not (number > 0 and math.isfinite(number)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def load_calibration(path: str | Path) -> EngineCalibration:
    """Read a calibration file; ValueError naming the file when it is missing or malformed."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except OSError as exc:
        raise ValueError(f"--calibration {p}: cannot read ({exc.__class__.__name__})") from None
    except json.JSONDecodeError:
        raise ValueError(f"--calibration {p}: not valid JSON") from None
    return EngineCalibration.from_dict(raw, f"--calibration {p}")


class CalibratedPerfModel(PerfModel):
    """:class:`PerfModel` whose steps cost what the profiled engine's fitted coefficients say and
    whose KV cache holds what the engine reported (when it did; else the catalog's estimate)."""

    __slots__ = ("calibration",)

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int, calibration: EngineCalibration) -> None:
        super().__init__(model, gpu, tp, Coefficients())
        self.calibration = calibration

    def step_time_s(self, shape: StepShape) -> float:
        return self.calibration.step_time_s(shape)

    def _step_time_s(self, n_prefill: int, prefill_seqs: int, prefill_attn_pairs: float, prefill_context_tokens: int,
                     n_decode: int, decode_context_tokens: int) -> float:
        return self.calibration.step_time_s(StepShape(n_prefill, prefill_seqs, prefill_attn_pairs,
                                                      prefill_context_tokens, n_decode, decode_context_tokens))

    def decode_run(self, batch: int, first_context_tokens: int, num_steps: int) -> tuple[list[float], list[float]]:
        """Same contract as :meth:`PerfModel.decode_run`: step ``j`` reads ``first + batch * j`` tokens."""
        if batch < 1 or num_steps < 1:
            raise ValueError(f"batch and num_steps must be >= 1, got {batch} and {num_steps}")
        shapes: Sequence[StepShape] = [StepShape(decode_seqs=batch, decode_context_tokens=first_context_tokens + batch * j)
                                       for j in range(num_steps)]
        return [self.step_time_s(s) for s in shapes], [self.step_flops(s) for s in shapes]

    def kv_capacity_tokens(
        self, gpu_memory_utilization: float = 0.9, activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES
    ) -> int:
        e = self.calibration.engine
        if e.num_gpu_blocks is not None and e.block_size_tokens is not None:
            return e.num_gpu_blocks * e.block_size_tokens
        return super().kv_capacity_tokens(gpu_memory_utilization, activation_reserve_bytes)
