"""A GPU inventory, possibly of several types: ``h100:4,h20:8`` (``--gpus``, ``cluster.gpus``).

Each entry is ``NAME:COUNT`` with an optional ``@tpN`` (GPUs per instance; default the
cluster's ``tp``): ``h100:4@tp4,h20:8@tp2`` is one TP4 H100 instance and four TP2 H20 ones.

How deployments use a mixed inventory:

* colocated (and ``colocated-offload``): every GPU type runs as mixed instances of its own
  shape, behind one router (``SimConfig.mixed_pools``);
* disaggregated (``disagg*``, ``ampd*``) on two types: the compute-rich type (higher dense BF16
  FLOP/s per GPU) prefills and the other decodes, the whitepaper's field setting (compute-rich
  cards prefill long contexts, bandwidth-rich H20s decode). The split is then the inventory's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tokenomy.perf.hardware import get_gpu

_ENTRY = re.compile(r"^\s*([A-Za-z0-9_.\-/]+)\s*:\s*(\d+)\s*(?:@\s*tp\s*(\d+))?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class GpuPool:
    """``gpus`` GPUs of one type, run as instances of ``tp`` GPUs each."""

    gpu: str
    gpus: int
    tp: int

    @property
    def instances(self) -> int:
        return self.gpus // self.tp

    @property
    def label(self) -> str:
        return f"{self.gpu}:{self.gpus}@tp{self.tp}"


def parse_gpus(text: str, default_tp: int = 1) -> tuple[GpuPool, ...]:
    """``"h100:4,h20:8@tp2"`` -> pools; ValueError (one line) on anything else."""
    pools = []
    for raw in text.split(","):
        m = _ENTRY.match(raw)
        if not m:
            raise ValueError(f"bad GPU inventory entry {raw.strip()!r} in {text!r}: expected NAME:COUNT[@tpN], "
                             "e.g. h100:4,h20:8@tp2")
        name, count, tp = m.group(1), int(m.group(2)), int(m.group(3) or default_tp)
        get_gpu(name)  # unknown names fail here, listing the catalog
        if count < 1 or tp < 1 or count % tp:
            raise ValueError(f"GPU inventory {raw.strip()!r}: {count} GPUs do not make instances of tp {tp}")
        pools.append(GpuPool(name, count, tp))
    names = [get_gpu(p.gpu).name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"GPU inventory {text!r} names a GPU type twice")
    return tuple(pools)


def format_gpus(pools: tuple[GpuPool, ...]) -> str:
    return ",".join(p.label for p in pools)


def role_pools(pools: tuple[GpuPool, ...]) -> tuple[GpuPool, GpuPool]:
    """(prefill pool, decode pool) of a two-type inventory: the higher dense FLOP/s prefills."""
    if len(pools) != 2:
        raise ValueError(f"a disaggregated deployment on a mixed inventory needs exactly two GPU types, got "
                         f"{format_gpus(pools)}")
    a, b = pools
    return (a, b) if get_gpu(a.gpu).bf16_flops_per_s >= get_gpu(b.gpu).bf16_flops_per_s else (b, a)
