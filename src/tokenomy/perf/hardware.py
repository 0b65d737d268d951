"""GPU hardware catalog: peak rates, memory, interconnect and a default price per GPU-hour.

Every rate is a *peak* from a public spec sheet; the performance model scales them by fitted
efficiencies (see ``coefficients.py``). Prices are labelled defaults (typical on-demand cloud list
prices, 2025), meant to be overridden with what a user actually pays via ``load_gpu_catalog``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tokenomy.core.errors import UnknownNameError

_GB = 1e9  # vendors quote bandwidth and (usually) memory in decimal gigabytes
_GIB = 2**30


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator. Bandwidths are per GPU, per direction, in bytes per second.

    ``intra_node_bytes_per_s`` is the scale-up link (NVLink, HCCS; PCIe when there is none),
    ``inter_node_bytes_per_s`` the scale-out NIC share of one GPU (InfiniBand / RoCE).
    """

    name: str
    bf16_flops_per_s: float
    hbm_bytes_per_s: float
    memory_bytes: float
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    pcie_bytes_per_s: float
    usd_per_gpu_hour: float
    source: str = ""  # where the figures come from (datasheet); the price is always a labelled default

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("name", "source") and not value > 0:
                raise ValueError(f"GPUSpec {self.name!r}: {f.name} must be > 0, got {value!r}")


# Dense (not 2:4 sparse) BF16 tensor-core peaks. PCIe figures are per direction.
_CATALOG: dict[str, GPUSpec] = {
    spec.name: spec
    for spec in (
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOPS BF16 dense (1,979 sparse),
        # 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s bidirectional, PCIe Gen5 128 GB/s bidirectional;
        # scale-out: one ConnectX-7 400 Gb/s NIC per GPU (DGX H100 datasheet).
        GPUSpec("H100-SXM", 989.4e12, 3.35e12, 80 * _GIB, 450 * _GB, 50 * _GB, 64 * _GB, 3.00,
                source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOPS BF16 dense, 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s bidirectional, PCIe Gen5 128 GB/s bidirectional; DGX H100 datasheet: one ConnectX-7 400 Gb/s NIC per GPU. Price: labelled default"),
        # NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 dense, 4.8 TB/s HBM3e, 141 GB,
        # NVLink 900 GB/s, PCIe Gen5; DGX H200: ConnectX-7 400 Gb/s per GPU.
        GPUSpec("H200", 989.4e12, 4.8e12, 141 * _GB, 450 * _GB, 50 * _GB, 64 * _GB, 3.80,
                source="NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 dense, 4.8 TB/s HBM3e, 141 GB, NVLink 900 GB/s; DGX H200: ConnectX-7 400 Gb/s per GPU. Price: labelled default"),
        # NVIDIA H20 (HGX H20 product brief): 148 TFLOPS BF16 dense, 4.0 TB/s, 96 GB HBM3,
        # NVLink 900 GB/s, PCIe Gen5 x16; 400 Gb/s NIC per GPU assumed as in HGX designs.
        GPUSpec("H20", 148e12, 4.0e12, 96 * _GB, 450 * _GB, 50 * _GB, 64 * _GB, 1.50,
                source="NVIDIA HGX H20 product brief: 148 TFLOPS FP16/BF16 dense, 4.0 TB/s HBM3, 96 GB, NVLink 900 GB/s, PCIe Gen5 x16; 400 Gb/s NIC per GPU assumed as in HGX designs (not in the brief). Price: labelled default"),
        # NVIDIA A100 datasheet (80GB SXM): 312 TFLOPS BF16 dense, 2,039 GB/s HBM2e, 80 GB,
        # NVLink 600 GB/s bidirectional, PCIe Gen4 64 GB/s bidirectional; DGX A100: 200 Gb/s HDR per GPU.
        GPUSpec("A100-80GB", 312e12, 2.039e12, 80 * _GIB, 300 * _GB, 25 * _GB, 32 * _GB, 2.00,
                source="NVIDIA A100 datasheet (80GB SXM): 312 TFLOPS BF16 dense, 2,039 GB/s HBM2e, 80 GB, NVLink 600 GB/s bidirectional, PCIe Gen4 64 GB/s bidirectional; DGX A100: 200 Gb/s HDR per GPU. Price: labelled default"),
        # NVIDIA L40S datasheet: 362.05 TFLOPS BF16 dense (733 sparse), 864 GB/s GDDR6, 48 GB,
        # no NVLink (peer traffic over PCIe Gen4 x16, 64 GB/s bidirectional); 200 Gb/s NIC assumed.
        GPUSpec("L40S", 362.05e12, 864 * _GB, 48 * _GB, 32 * _GB, 25 * _GB, 32 * _GB, 1.00,
                source="NVIDIA L40S datasheet: 362.05 TFLOPS BF16 dense, 864 GB/s GDDR6, 48 GB, no NVLink (PCIe Gen4 x16); 200 Gb/s NIC assumed. Price: labelled default"),
        # Huawei Ascend 910B (public figures for the 910B3 SKU; they vary by SKU): ~313 TFLOPS
        # FP16/BF16 dense, 64 GB HBM2e at ~1.6 TB/s, HCCS 392 GB/s per chip, 200 Gb/s RoCE per NPU,
        # PCIe Gen5 x16.
        GPUSpec("Ascend-910B", 313e12, 1.6e12, 64 * _GB, 196 * _GB, 25 * _GB, 64 * _GB, 1.50,
                source="Huawei Ascend 910B3 public figures (vary by SKU): ~313 TFLOPS FP16/BF16 dense, 64 GB HBM2e at ~1.6 TB/s, HCCS 392 GB/s per chip, 200 Gb/s RoCE per NPU, PCIe Gen5 x16. Price: labelled default"),
    )
}

_ALIASES: dict[str, str] = {
    "h100": "H100-SXM",
    "h100-80gb": "H100-SXM",
    "h100-sxm5": "H100-SXM",
    "h200-sxm": "H200",
    "a100": "A100-80GB",
    "a100-sxm": "A100-80GB",
    "a100-80g": "A100-80GB",
    "910b": "Ascend-910B",
    "ascend910b": "Ascend-910B",
}


def gpu_names() -> list[str]:
    """Canonical names of the catalog entries, sorted."""
    return sorted(_CATALOG)


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU up by name or alias, case-insensitively, or read one from a YAML/JSON file
    (``*.yaml``, ``*.yml``, ``*.json``; see :func:`load_gpu_file`).

    Raises ``UnknownNameError`` (a ValueError and KeyError) naming every known GPU when ``name`` is unknown.
    """
    if name.lower().endswith((".yaml", ".yml", ".json")):
        return load_gpu_file(name)
    key = name.strip().lower()
    for canonical in _CATALOG:
        if canonical.lower() == key:
            return _CATALOG[canonical]
    if key in _ALIASES:
        return _CATALOG[_ALIASES[key]]
    raise UnknownNameError(f"unknown GPU {name!r}; known: {', '.join(gpu_names())} (aliases: {', '.join(sorted(_ALIASES))})")


def load_gpu_file(path: str | Path) -> GPUSpec:
    """One GPU from a YAML or JSON mapping of ``GPUSpec`` fields, without touching the catalog.

    ``name`` of a catalog GPU may give only the fields it changes; a new GPU gives them all.
    Raises ValueError naming the file for anything else.
    """
    import yaml

    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--gpu {p}: cannot read ({exc.__class__.__name__})") from None
    except yaml.YAMLError:
        raise ValueError(f"--gpu {p}: not valid YAML/JSON") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--gpu {p}: expected a mapping of GPU fields (name, memory_bytes, ...)")
    specs = _parse_entries(p, [raw])
    return specs[0]


def load_gpu_catalog(path: str | Path) -> list[GPUSpec]:
    """Add or override catalog entries from a user JSON file and return the loaded specs.

    The file is a list of objects (or an object mapping name -> fields). An entry whose name
    matches a known GPU may give only the fields it changes (e.g. ``usd_per_gpu_hour``);
    a new GPU must give every ``GPUSpec`` field. Raises ``ValueError`` on malformed input.
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    entries = [dict(v, name=k) for k, v in raw.items()] if isinstance(raw, dict) else raw
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{path}: expected a list of GPU objects or a name -> fields object")
    loaded = _parse_entries(path, entries)
    for spec in loaded:
        _CATALOG[spec.name] = spec
    return loaded


def _parse_entries(path: Path, entries: list[dict[str, Any]]) -> list[GPUSpec]:
    known_fields = {f.name for f in fields(GPUSpec)}
    loaded: list[GPUSpec] = []
    for entry in entries:
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{path}: every GPU entry needs a string 'name'")
        unknown = set(entry) - known_fields
        if unknown:
            raise ValueError(f"{path}: GPU {name!r} has unknown fields {sorted(unknown)}; known: {sorted(known_fields)}")
        try:
            numbers: dict[str, Any] = {k: float(v) for k, v in entry.items() if k not in ("name", "source")}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: GPU {name!r} has a non-numeric field: {exc}") from None
        source = str(entry.get("source", f"user file {path}"))
        try:
            base = get_gpu(name)
        except KeyError:
            missing = known_fields - set(numbers) - {"name", "source"}
            if missing:
                raise ValueError(f"{path}: new GPU {name!r} is missing fields {sorted(missing)}") from None
            numbers["source"] = source
            spec = GPUSpec(name, *(numbers[f.name] for f in fields(GPUSpec) if f.name != "name"))
        else:
            given = sorted(numbers)
            numbers["source"] = str(entry["source"]) if "source" in entry else (
                f"{base.source}; {', '.join(given)} from {path}" if given else base.source)
            spec = GPUSpec(base.name, *(numbers.get(f.name, getattr(base, f.name)) for f in fields(GPUSpec)
                                        if f.name != "name"))
        loaded.append(spec)
    return loaded
