"""A step-time model fitted to timings measured on a running engine (``tokenomy perf profile``).

Where the roofline of :mod:`tokenomy.perf.model` prices every kernel from catalog peaks, this
model prices a whole engine iteration from a handful of coefficients fitted to what a live
engine took, so it holds for any engine on any hardware, vLLM on a CPU included::

    step_time_s = fixed_s + max(floor_s, token_s * T) + prefill_seq_s * Sp + decode_seq_s * Sd
                  + pair_s * P + context_s * C + mixed_s * [Sp > 0 and Sd > 0]

with ``T`` tokens through the linear layers (prefill tokens + decoding sequences), ``Sp`` prefill
chunks and ``Sd`` decoding sequences (LM head rows, sampling, per-request bookkeeping; a prefill
chunk also carries what a request costs the server before and after the engine, measured in
TTFT: parsing, tokenizing, detokenizing), ``P`` prefill query-key pairs and ``C`` KV tokens
attention reads (prefill and decode context). ``floor_s`` is the weight read a GPU pays however few tokens a step carries
(the roofline's memory floor); on a CPU, whose small-model weights sit in cache, it fits to 0.
``mixed_s`` is what a step pays for carrying prefill chunks and decoding sequences at once beyond
the sum of its parts (e.g. an engine that runs prefill and decode attention as separate passes,
each with its own set-up, as vLLM's CPU backend does); only mixed probes (a chunk sent while a
batch decodes) pin it, and without them it fits to 0.

A :class:`Measurement` is one observed interval and the steps the engine ran in it (a TTFT
covers every chunk of a prompt; an inter-token gap one decode step). :func:`fit_steps` fits
the coefficients by least squares on relative error, so a 5 ms step weighs as much as a 500 ms
prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from tokenomy.core.step import StepShape
from tokenomy.perf.coefficients import floats_from_dict


@dataclass(frozen=True, slots=True)
class StepCoefficients:
    """Seconds per unit of each step feature (see the module docstring); all >= 0."""

    fixed_s: float = 0.0
    floor_s: float = 0.0
    token_s: float = 0.0
    prefill_seq_s: float = 0.0
    decode_seq_s: float = 0.0
    pair_s: float = 0.0
    context_s: float = 0.0
    mixed_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (value >= 0 and np.isfinite(value)):
                raise ValueError(f"StepCoefficients.{f.name} must be a finite number >= 0, got {value}")

    def step_time_s(self, shape: StepShape) -> float:
        """Wall time of one iteration; 0.0 for an empty batch."""
        t = shape.prefill_tokens + shape.decode_seqs
        if t == 0:
            return 0.0
        linear = self.token_s * t
        return (self.fixed_s + (linear if linear > self.floor_s else self.floor_s)
                + self.prefill_seq_s * shape.prefill_seqs + self.decode_seq_s * shape.decode_seqs
                + self.pair_s * shape.prefill_attn_pairs
                + self.context_s * (shape.prefill_context_tokens + shape.decode_context_tokens)
                + (self.mixed_s if shape.prefill_seqs and shape.decode_seqs else 0.0))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> StepCoefficients:
        return floats_from_dict(cls, data, "step coefficients")


@dataclass(frozen=True, slots=True)
class Measurement:
    """``time_s`` observed over the engine steps ``steps`` (their times add up); ``kind`` labels
    the probe (``"prefill"``, ``"decode"``, ``"mixed"``) for per-kind errors."""

    kind: str
    steps: tuple[StepShape, ...]
    time_s: float

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a measurement covers at least one engine step")
        if not (self.time_s > 0 and np.isfinite(self.time_s)):
            raise ValueError(f"a measured time must be a finite number > 0, got {self.time_s}")


def prefill_steps(prompt_tokens: int, chunk_tokens: int, cached_tokens: int = 0) -> tuple[StepShape, ...]:
    """The steps of one request alone on the engine from arrival to its first token: its prompt
    after ``cached_tokens`` of prefix hits, in chunks of at most ``chunk_tokens`` (the engine's
    ``max_num_batched_tokens``)."""
    if prompt_tokens < 1 or chunk_tokens < 1 or not 0 <= cached_tokens < prompt_tokens:
        raise ValueError(f"need prompt_tokens >= 1, chunk_tokens >= 1 and 0 <= cached_tokens < prompt_tokens; got "
                         f"{prompt_tokens}, {chunk_tokens}, {cached_tokens}")
    steps = []
    done = cached_tokens
    while done < prompt_tokens:
        n = min(chunk_tokens, prompt_tokens - done)
        steps.append(StepShape(prefill_tokens=n, prefill_seqs=1, prefill_attn_pairs=StepShape.chunk_attn_pairs(n, done),
                               prefill_context_tokens=done + n))
        done += n
    return tuple(steps)


def decode_step(batch: int, context_tokens: int) -> StepShape:
    """One decode step of ``batch`` sequences reading ``context_tokens`` of KV in all."""
    if batch < 1 or context_tokens < 0:
        raise ValueError(f"need batch >= 1 and context_tokens >= 0, got {batch}, {context_tokens}")
    return StepShape(decode_seqs=batch, decode_context_tokens=context_tokens)


def mixed_step(prefill: StepShape, batch: int, context_tokens: int) -> StepShape:
    """One step that runs the prefill chunk ``prefill`` while ``batch`` sequences decode on
    ``context_tokens`` of KV (a request arriving while others decode: an agent turn's shape)."""
    d = decode_step(batch, context_tokens)
    return replace(prefill, decode_seqs=d.decode_seqs, decode_context_tokens=d.decode_context_tokens)


def _features(shape: StepShape) -> tuple[float, ...]:
    """``(1, T, Sp, Sd, P, C, mixed)`` of one step (the floor is handled apart: it is not linear)."""
    return (1.0, float(shape.prefill_tokens + shape.decode_seqs), float(shape.prefill_seqs), float(shape.decode_seqs),
            float(shape.prefill_attn_pairs), float(shape.prefill_context_tokens + shape.decode_context_tokens),
            float(bool(shape.prefill_seqs and shape.decode_seqs)))


@dataclass(frozen=True)
class StepFit:
    """Fitted coefficients and their mean absolute relative error per measurement kind and overall."""

    coefficients: StepCoefficients
    mape: float
    mape_by_kind: dict[str, float]
    points: int

    def summary(self) -> dict[str, object]:
        return {"mape": self.mape, "mape_by_kind": dict(self.mape_by_kind), "points": self.points}


def predict(coefficients: StepCoefficients, m: Measurement) -> float:
    return sum(coefficients.step_time_s(s) for s in m.steps)


def score(coefficients: StepCoefficients, measurements: Sequence[Measurement]) -> StepFit:
    """Mean absolute relative error of ``coefficients`` on ``measurements``, per kind and overall."""
    if not measurements:
        raise ValueError("no measurements to score")
    errors: dict[str, list[float]] = {}
    for m in measurements:
        errors.setdefault(m.kind, []).append(abs(predict(coefficients, m) - m.time_s) / m.time_s)
    everything = [e for es in errors.values() for e in es]
    return StepFit(coefficients, float(np.mean(everything)),
                   {k: float(np.mean(v)) for k, v in sorted(errors.items())}, len(everything))


def fit_steps(measurements: Sequence[Measurement]) -> StepFit:
    """Least-squares coefficients (relative error, all >= 0) for ``measurements``.

    The floor makes the model piecewise linear: for a floor of ``F`` tokens' worth (``floor_s =
    F * token_s``) the rest is a non-negative linear least-squares problem, solved for F = 0 and
    every measured token count, then refined between the best count's neighbours.
    Raises ValueError with fewer measurements than coefficients.
    """
    from scipy.optimize import minimize_scalar, nnls  # scipy: imported only when fitting

    n_coef = len(fields(StepCoefficients))
    if len(measurements) < n_coef:
        raise ValueError(f"need at least {n_coef} measurements to fit {n_coef} coefficients, got {len(measurements)}")
    y = np.array([m.time_s for m in measurements])
    feats = [np.array([_features(s) for s in m.steps]) for m in measurements]
    tokens = [f[:, 1] for f in feats]

    def solve(floor_tokens: float) -> tuple[StepCoefficients, float]:
        # With the floor at ``floor_tokens * token_s``, a step of T tokens costs token_s * max(T, floor_tokens):
        # linear in token_s again. Columns are scaled to unit norm so nnls is well conditioned.
        rows = []
        for f, t in zip(feats, tokens, strict=True):
            g = f.copy()
            g[:, 1] = np.maximum(t, floor_tokens)
            rows.append(g.sum(axis=0))
        a = np.array(rows) / y[:, None]
        scale = np.linalg.norm(a, axis=0)
        scale[scale == 0] = 1.0
        x, residual = nnls(a / scale, np.ones(len(y)))
        x = [float(v) for v in x / scale]
        return StepCoefficients(fixed_s=x[0], floor_s=x[1] * floor_tokens, token_s=x[1], prefill_seq_s=x[2],
                                decode_seq_s=x[3], pair_s=x[4], context_s=x[5], mixed_s=x[6]), float(residual)

    # The residual is piecewise smooth in the floor, with kinks at the measured token counts: try
    # each count, then refine between the best one's neighbours.
    candidates = sorted({0.0} | {float(v) for t in tokens for v in t})
    residuals = [solve(c)[1] for c in candidates]
    i = int(np.argmin(residuals))
    lo, hi = candidates[max(i - 1, 0)], candidates[min(i + 1, len(candidates) - 1)]
    fits = [solve(candidates[i])[0]]
    if hi > lo:
        best = minimize_scalar(lambda c: solve(c)[1], bounds=(lo, hi), method="bounded",
                               options={"xatol": 1e-6 * max(hi, 1.0)})
        fits.append(solve(float(best.x))[0])
    return min((score(c, measurements) for c in fits), key=lambda fit: fit.mape)
