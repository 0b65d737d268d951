"""Fit ``Coefficients`` to Vidur operator profiles and score them on held-out points.

Each measured operator is predicted with the roofline of ``ops.op_time_s``. Per GPU, the
efficiencies and per-kernel latencies are fitted by least squares on log time (relative error,
so 20 us kernels weigh as much as 20 ms ones) over a deterministic half of the points: a
(model, num_tokens, tp) configuration goes to training when the CRC32 of its key is even, so all
operators of one configuration fall on the same side. MAPE is scored on the other half.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from tokenomy.perf.coefficients import Coefficients
from tokenomy.perf.hardware import get_gpu
from tokenomy.perf.ops import GEMM, OpCost, allreduce_time_s, embedding_op, layer_ops
from tokenomy.perf.profiles import (
    AllReduceSample,
    OperatorSample,
    read_allreduce_samples,
    read_operator_samples,
)

# Fitted fields in parameter-vector order; latencies are fitted in microseconds for scaling.
_EFFICIENCY_FIELDS = ("compute_efficiency", "memory_efficiency", "norm_efficiency", "rope_efficiency",
                      "activation_efficiency", "add_efficiency", "embedding_efficiency")
_LATENCY_FIELDS = ("gemm_latency_s", "elementwise_latency_s")


def is_training_point(model: str, num_tokens: int, tp: int) -> bool:
    return zlib.crc32(f"{model}|{num_tokens}|{tp}".encode()) % 2 == 0


def sample_cost(s: OperatorSample) -> OpCost:
    sh = s.shape
    if s.op == "emb":
        return embedding_op(sh.hidden_size)
    ops = layer_ops(sh.hidden_size, sh.n_heads, sh.n_kv_heads, sh.hidden_size // sh.n_heads,
                    sh.intermediate_size, s.tp, gated_mlp=sh.gated_mlp)
    if s.op not in ops:
        raise ValueError(f"profile operator {s.op!r} is not modelled; known: {sorted([*ops, 'emb'])}")
    return ops[s.op]


class _GPUProblem:
    """Vectorised roofline for the samples of one GPU (same formula as ``ops.op_time_s``)."""

    def __init__(self, samples: list[OperatorSample]) -> None:
        gpu = get_gpu(samples[0].gpu)
        costs = [sample_cost(s) for s in samples]
        tokens = np.array([s.num_tokens for s in samples], dtype=float)
        self.compute_s = np.array([c.flops_per_token for c in costs]) * tokens / gpu.bf16_flops_per_s
        self.memory_s = np.array([c.fixed_bytes + c.bytes_per_token * t for c, t in zip(costs, tokens, strict=True)])
        self.memory_s /= gpu.hbm_bytes_per_s
        self.is_gemm = np.array([c.kind == GEMM for c in costs])
        self.eff_index = np.array([_EFFICIENCY_FIELDS.index(c.efficiency) for c in costs])
        self.measured_s = np.array([s.time_s for s in samples])
        self.train = np.array([is_training_point(s.model, s.num_tokens, s.tp) for s in samples])
        self.ops = np.array([s.op for s in samples])
        self.configs = [(s.model, s.num_tokens, s.tp) for s in samples]

    def predict(self, c: Coefficients) -> np.ndarray:
        eff = np.array([getattr(c, f) for f in _EFFICIENCY_FIELDS])[self.eff_index]
        memory = self.memory_s / eff
        gemm = c.gemm_latency_s + np.maximum(self.compute_s / c.compute_efficiency, memory)
        return np.where(self.is_gemm, gemm, c.elementwise_latency_s + memory)


def _from_vector(x: np.ndarray, base: Coefficients) -> Coefficients:
    values = dict(zip(_EFFICIENCY_FIELDS, x[: len(_EFFICIENCY_FIELDS)], strict=True))
    values.update(zip(_LATENCY_FIELDS, x[len(_EFFICIENCY_FIELDS):] * 1e-6, strict=True))
    return replace(base, **{k: float(v) for k, v in values.items()})


def _fit_compute(problem: _GPUProblem) -> Coefficients:
    base = Coefficients()
    n_eff = len(_EFFICIENCY_FIELDS)
    x0 = np.array([0.7] * n_eff + [5.0] * len(_LATENCY_FIELDS))
    lower = np.array([0.02] * n_eff + [0.0] * len(_LATENCY_FIELDS))
    upper = np.array([2.0] * n_eff + [200.0] * len(_LATENCY_FIELDS))
    log_y = np.log(problem.measured_s[problem.train])

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(problem.predict(_from_vector(x, base))[problem.train]) - log_y

    result = least_squares(residuals, x0, bounds=(lower, upper))
    return _from_vector(result.x, base)


def _fit_allreduce(samples: list[AllReduceSample], base: Coefficients) -> Coefficients:
    link = get_gpu(samples[0].gpu).intra_node_bytes_per_s
    train = [s for s in samples if is_training_point("allreduce", s.size_bytes, s.n_workers)]
    log_y = np.log([s.time_s for s in train])

    def residuals(x: np.ndarray) -> np.ndarray:
        c = replace(base, allreduce_latency_s=float(x[0]) * 1e-6, allreduce_efficiency=float(x[1]))
        return np.log([allreduce_time_s(s.size_bytes, s.n_workers, link, c) for s in train]) - log_y

    x = least_squares(residuals, np.array([10.0, 0.5]), bounds=([0.0, 0.01], [500.0, 2.0])).x
    return replace(base, allreduce_latency_s=float(x[0]) * 1e-6, allreduce_efficiency=float(x[1]))


def _mape(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - measured) / measured)) if len(measured) else float("nan")


@dataclass(frozen=True)
class GPUValidation:
    """Held-out errors for one GPU: per operator call, and per layer (sum of a row's operators)."""

    gpu: str
    points: int
    mape_roofline: float
    mape_fitted: float
    layer_mape_roofline: float
    layer_mape_fitted: float
    per_op_mape_fitted: dict[str, float] = field(default_factory=dict)
    allreduce_points: int = 0
    allreduce_mape_fitted: float = float("nan")


@dataclass(frozen=True)
class Calibration:
    coefficients: dict[str, Coefficients]
    validation: list[GPUValidation]

    def summary(self) -> dict[str, Any]:
        """``{"mape_roofline", "mape_fitted", "points", "per_gpu": [...]}``; MAPEs are point-weighted."""
        points = sum(v.points for v in self.validation)

        def pooled(attr: str) -> float:
            return sum(getattr(v, attr) * v.points for v in self.validation) / points

        return {
            "mape_roofline": pooled("mape_roofline"),
            "mape_fitted": pooled("mape_fitted"),
            "points": points,
            "layer_mape_roofline": pooled("layer_mape_roofline"),
            "layer_mape_fitted": pooled("layer_mape_fitted"),
            "per_gpu": [v.__dict__ for v in self.validation],
        }


def _layer_mape(problem: _GPUProblem, pred: np.ndarray, mask: np.ndarray) -> float:
    sums: dict[tuple[str, int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for i in np.nonzero(mask)[0]:
        acc = sums[problem.configs[i]]
        acc[0] += float(problem.measured_s[i])
        acc[1] += float(pred[i])
    return float(np.mean([abs(p - m) / m for m, p in sums.values()]))


def calibrate(profiles_dir: str | Path) -> Calibration:
    """Fit every profiled GPU on the training half and score roofline and fit on the held-out half.

    Raises ``FileNotFoundError`` when ``profiles_dir`` holds no Vidur compute profiles.
    """
    samples = read_operator_samples(profiles_dir)
    allreduce = read_allreduce_samples(profiles_dir)
    by_gpu: dict[str, list[OperatorSample]] = defaultdict(list)
    for s in samples:
        if s.time_s > 0:
            by_gpu[s.gpu].append(s)
    coefficients: dict[str, Coefficients] = {}
    validation: list[GPUValidation] = []
    for gpu, gpu_samples in sorted(by_gpu.items()):
        problem = _GPUProblem(gpu_samples)
        fitted = _fit_compute(problem)
        ar = [s for s in allreduce if s.gpu == gpu]
        ar_test: list[AllReduceSample] = []
        if ar:
            fitted = _fit_allreduce(ar, fitted)
            ar_test = [s for s in ar if not is_training_point("allreduce", s.size_bytes, s.n_workers)]
        coefficients[gpu] = fitted
        test = ~problem.train
        roof, fit = problem.predict(Coefficients()), problem.predict(fitted)
        link = get_gpu(gpu).intra_node_bytes_per_s
        ar_pred = np.array([allreduce_time_s(s.size_bytes, s.n_workers, link, fitted) for s in ar_test])
        validation.append(GPUValidation(
            gpu=gpu,
            points=int(test.sum()),
            mape_roofline=_mape(roof[test], problem.measured_s[test]),
            mape_fitted=_mape(fit[test], problem.measured_s[test]),
            layer_mape_roofline=_layer_mape(problem, roof, test),
            layer_mape_fitted=_layer_mape(problem, fit, test),
            per_op_mape_fitted={op: _mape(fit[test & (problem.ops == op)], problem.measured_s[test & (problem.ops == op)])
                                for op in sorted(set(problem.ops.tolist()))},
            allreduce_points=len(ar_test),
            allreduce_mape_fitted=_mape(ar_pred, np.array([s.time_s for s in ar_test])),
        ))
    return Calibration(coefficients, validation)
