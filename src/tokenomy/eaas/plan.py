"""Cost model: scale experts one GPU at a time (EAAS) versus a monolithic deployment in fixed units.

Demand is the number of GPUs the load needs at each time step (fractional). A monolithic MoE
deployment can only grow and shrink in whole units (DeepSeek-V3's recommended unit is 320 GPUs, a
whitepaper figure, the default here and configurable); EAAS rounds up to ``elastic_step_gpus`` (1).
We also report a static deployment sized for the peak, which is what a rigid group often runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEEPSEEK_V3_UNIT_GPUS = 320  # whitepaper: recommended base unit for DeepSeek-V3, 320 x 80 GB GPUs


def diurnal_curve(peak_gpus: float, trough_fraction: float = 0.3, hours: float = 24.0, step_h: float = 1.0,
                  peak_hour: float = 14.0) -> list[float]:
    """GPUs needed at the middle of each step: a cosine day between ``trough_fraction * peak`` and peak."""
    if peak_gpus <= 0 or not 0 <= trough_fraction <= 1 or hours <= 0 or step_h <= 0:
        raise ValueError("need peak_gpus > 0, 0 <= trough_fraction <= 1, hours > 0, step_h > 0")
    trough = trough_fraction * peak_gpus
    n = max(1, round(hours / step_h))
    return [trough + (peak_gpus - trough) * (1 + math.cos(2 * math.pi * ((i + 0.5) * step_h - peak_hour) / 24)) / 2
            for i in range(n)]


@dataclass(frozen=True)
class ScalingComparison:
    """GPU allocations per step and their GPU-hours. Savings are fractions of the baseline's GPU-hours."""

    step_h: float
    demand_gpus: tuple[float, ...]
    elastic_gpus: tuple[int, ...]
    unit_gpus: tuple[int, ...]
    static_gpus: int
    elastic_gpu_hours: float
    unit_gpu_hours: float
    static_gpu_hours: float

    @property
    def saving_vs_unit(self) -> float:
        return 1 - self.elastic_gpu_hours / self.unit_gpu_hours

    @property
    def saving_vs_static(self) -> float:
        return 1 - self.elastic_gpu_hours / self.static_gpu_hours


def _round_up(gpus: float, step: int) -> int:
    # A tiny tolerance keeps 320.0000001 (float noise) from costing a whole extra unit.
    return max(step, step * math.ceil(gpus / step - 1e-9))


def compare_scaling(demand_gpus: Sequence[float], step_h: float = 1.0, unit_gpus: int = DEEPSEEK_V3_UNIT_GPUS,
                    elastic_step_gpus: int = 1, headroom_fraction: float = 0.0) -> ScalingComparison:
    """Allocate each step's demand (times ``1 + headroom_fraction``) in elastic steps and in fixed units."""
    if not demand_gpus or any(d < 0 for d in demand_gpus):
        raise ValueError("demand must be a non-empty sequence of GPU counts >= 0")
    if unit_gpus < 1 or elastic_step_gpus < 1 or step_h <= 0 or headroom_fraction < 0:
        raise ValueError("need unit_gpus >= 1, elastic_step_gpus >= 1, step_h > 0, headroom_fraction >= 0")
    need = [d * (1 + headroom_fraction) for d in demand_gpus]
    elastic = tuple(_round_up(d, elastic_step_gpus) for d in need)
    unit = tuple(_round_up(d, unit_gpus) for d in need)
    static = max(unit)
    return ScalingComparison(
        step_h=step_h, demand_gpus=tuple(demand_gpus), elastic_gpus=elastic, unit_gpus=unit, static_gpus=static,
        elastic_gpu_hours=sum(elastic) * step_h, unit_gpu_hours=sum(unit) * step_h,
        static_gpu_hours=static * len(need) * step_h,
    )
