"""Reader for Vidur-format operator profiles (``compute/<gpu>/<org>/<model>/mlp.csv`` and
``network/<gpu>_dgx/all_reduce.csv``).

Vidur times are milliseconds; everything returned here is in seconds. Each compute row holds,
for one (model shape, num_tokens, tensor-parallel degree), the per-layer time of every operator.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Vidur's profiled GPU folder name -> catalog GPU name.
PROFILE_GPUS: dict[str, str] = {"h100": "H100-SXM", "a100": "A100-80GB"}

_SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "num_tokens",
                  "num_tensor_parallel_workers")


@dataclass(frozen=True, slots=True)
class LayerShape:
    """The model shape columns of a profile row."""

    n_heads: int
    n_kv_heads: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool


@dataclass(frozen=True, slots=True)
class OperatorSample:
    """One measured operator: median time over Vidur's repetitions."""

    gpu: str  # catalog name, e.g. "H100-SXM"
    model: str  # "<org>/<model>" folder
    op: str  # Vidur operator name, e.g. "mlp_up_proj"
    shape: LayerShape
    num_tokens: int
    tp: int
    time_s: float


@dataclass(frozen=True, slots=True)
class AllReduceSample:
    gpu: str
    n_workers: int
    size_bytes: int
    time_s: float


def _require_dir(root: Path) -> None:
    if not root.is_dir():
        raise FileNotFoundError(f"profiles directory {root} does not exist (expected Vidur's compute/ and network/)")


def _mlp_files(root: Path) -> Iterator[tuple[str, str, Path]]:
    for folder, gpu in sorted(PROFILE_GPUS.items()):
        for path in sorted((root / "compute" / folder).glob("*/*/mlp.csv")):
            yield gpu, f"{path.parent.parent.name}/{path.parent.name}", path


def read_operator_samples(root: str | Path) -> list[OperatorSample]:
    """All operator measurements under ``root`` (a Vidur ``profiles/`` folder).

    Raises ``FileNotFoundError`` if ``root`` or every ``mlp.csv`` is missing and ``ValueError``
    naming the file when a row lacks a shape column.
    """
    root = Path(root)
    _require_dir(root)
    samples: list[OperatorSample] = []
    for gpu, model, path in _mlp_files(root):
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            columns = reader.fieldnames or []
            missing = [c for c in _SHAPE_COLUMNS if c not in columns]
            if missing:
                raise ValueError(f"{path}: missing columns {missing}")
            ops = [c[len("time_stats."):-len(".median")] for c in columns
                   if c.startswith("time_stats.") and c.endswith(".median")]
            for row in reader:
                shape = LayerShape(int(row["n_head"]), int(row["n_kv_head"]), int(row["n_embd"]),
                                   int(row["n_expanded_embd"]), int(row["vocab_size"]),
                                   row.get("use_gated_mlp", "True").strip().lower() == "true")
                tokens, tp = int(row["num_tokens"]), int(row["num_tensor_parallel_workers"])
                for op in ops:
                    cell = row[f"time_stats.{op}.median"]
                    if cell:
                        samples.append(OperatorSample(gpu, model, op, shape, tokens, tp, float(cell) * 1e-3))
    if not samples:
        raise FileNotFoundError(f"no compute/{{h100,a100}}/<org>/<model>/mlp.csv under {root}")
    return samples


def read_allreduce_samples(root: str | Path) -> list[AllReduceSample]:
    """Intra-node all-reduce measurements (all workers in one node), per catalog GPU."""
    root = Path(root)
    _require_dir(root)
    samples: list[AllReduceSample] = []
    for folder, gpu in sorted(PROFILE_GPUS.items()):
        path = root / "network" / f"{folder}_dgx" / "all_reduce.csv"
        if not path.is_file():
            continue
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                n = int(row["num_workers"])
                # Cross-node rows are priced by the inter-node link instead; skip them here.
                if n != int(row["devices_per_node"]) or n < 2:
                    continue
                samples.append(AllReduceSample(gpu, n, int(row["size"]),
                                               float(row["time_stats.all_reduce.median"]) * 1e-3))
    return samples
