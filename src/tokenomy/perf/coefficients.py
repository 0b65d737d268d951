"""Efficiency coefficients that turn hardware peaks into predicted kernel times.

The defaults are an *uncalibrated* roofline (every kernel at peak, no launch latency, except the
labelled defaults below). ``tokenomy perf fit`` fits the GEMM, elementwise and all-reduce fields
per GPU from Vidur profiles and the package ships the result in ``coefficients.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import TypeVar

SHIPPED_FILE = "coefficients.json"

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Coefficients:
    """Fractions of peak (0, 1] and fixed latencies in seconds.

    Fitted from profiles: ``compute_efficiency`` and ``memory_efficiency`` of GEMMs, one HBM
    efficiency per elementwise kernel kind (norm, rope, activation, residual add, embedding),
    fixed per-kernel latencies, ``allreduce_latency_s`` and ``allreduce_efficiency``.
    Not in the profiles, labelled defaults: attention efficiencies (FlashAttention reaches
    roughly half of peak FLOPs in prefill and most of HBM bandwidth in decode) and
    ``step_overhead_s`` (scheduler, sampling and launch work per engine step, a few ms in vLLM)
    and ``kv_transfer_setup_s`` (connection/descriptor setup of one KV transfer over RDMA).
    """

    compute_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    gemm_latency_s: float = 0.0
    norm_efficiency: float = 1.0
    rope_efficiency: float = 1.0
    activation_efficiency: float = 1.0
    add_efficiency: float = 1.0
    embedding_efficiency: float = 1.0
    elementwise_latency_s: float = 0.0
    attn_compute_efficiency: float = 0.5
    attn_memory_efficiency: float = 0.7
    allreduce_latency_s: float = 0.0
    allreduce_efficiency: float = 1.0
    step_overhead_s: float = 3e-3
    kv_transfer_setup_s: float = 5e-4

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s"):
                if value < 0:
                    raise ValueError(f"Coefficients.{f.name} must be >= 0 seconds, got {value}")
            elif not 0 < value <= 2.0:
                # Above 1 is tolerated: an efficiency also absorbs what a simple byte count misses
                # (e.g. an operand still in L2 cache from the previous kernel).
                raise ValueError(f"Coefficients.{f.name} must be a fraction of peak in (0, 2], got {value}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> Coefficients:
        return floats_from_dict(cls, data, "coefficient fields")


def floats_from_dict(cls: type[_T], data: dict[str, float], what: str) -> _T:
    """A dataclass of float fields from ``{field: number}``; a ValueError names unknown ``what``."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {what} {sorted(unknown)}; known: {sorted(known)}")
    return cls(**{k: float(v) for k, v in data.items()})


def load_coefficients(path: str | Path) -> dict[str, Coefficients]:
    """Read a ``{gpu name: {field: value}}`` JSON file (as written by ``tokenomy perf fit``)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    gpus = raw.get("gpus", raw) if isinstance(raw, dict) else None
    if not isinstance(gpus, dict):
        raise ValueError(f"{path}: expected an object with a 'gpus' mapping")
    return {name: Coefficients.from_dict(values) for name, values in gpus.items()}


def save_coefficients(path: str | Path, per_gpu: dict[str, Coefficients], source: str = "") -> None:
    payload = {"source": source, "gpus": {name: c.to_dict() for name, c in sorted(per_gpu.items())}}
    Path(path).write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")


def shipped_coefficients() -> dict[str, Coefficients]:
    """The fitted coefficients shipped with the package (empty if the file is absent)."""
    resource = resources.files("tokenomy.perf").joinpath(SHIPPED_FILE)
    if not resource.is_file():
        return {}
    with resources.as_file(resource) as path:
        return load_coefficients(path)
