"""Expert checkpoint: the routed experts of a whole model in one local safetensors file.

Every routed expert of every MoE layer has one *key* (the ``expert_id`` on the wire and in the
registry): the k-th MoE layer's expert e is ``offsets[k] + e``. Tensors are
``experts.{key}.{gate,up,down}_proj.weight`` ([I,H], [I,H], [H,I]); the metadata holds the format
tag, the hidden size and the layer map (module name -> key offset, as JSON).

A server reads only the keys it hosts (``safe_open``), so expert e of layer l is in the memory of the
servers that host it and nowhere else. Written by ``tokenomy.eaas.hf.save_expert_checkpoint``; read
by ``python -m tokenomy.eaas.server --expert-file``. Needs safetensors and torch, not transformers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from tokenomy.eaas.moe import ExpertWeights

FORMAT = "tokenomy-eaas-experts/1"
_PROJ = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint holds: ``hidden`` size, every key, and the layer map (name -> key offset)."""

    hidden: int
    keys: tuple[int, ...]
    layers: dict[str, int]


def save_experts(path: str | Path, experts: Mapping[int, ExpertWeights], layers: Mapping[str, int]) -> None:
    """Write ``experts`` (key -> weights, all of one hidden size) with the layer map."""
    from safetensors.torch import save_file

    if not experts:
        raise ValueError("no experts to save")
    hidden = {w.w_down.shape[0] for w in experts.values()}
    if len(hidden) != 1:
        raise ValueError(f"experts disagree on the hidden size: {sorted(hidden)}")
    tensors = {f"experts.{k}.{p}.weight": t.detach().contiguous()
               for k, w in experts.items() for p, t in zip(_PROJ, (w.w_gate, w.w_up, w.w_down), strict=True)}
    meta = {"format": FORMAT, "hidden": str(hidden.pop()), "layers": json.dumps(dict(layers))}
    save_file(tensors, str(path), metadata=meta)


def read_info(path: str | Path) -> CheckpointInfo:
    """The checkpoint's hidden size, keys and layer map; ValueError if it is not an expert checkpoint."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"expert checkpoint not found: {path}")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        names = list(f.keys())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: not an expert checkpoint (format {meta.get('format')!r}, expected {FORMAT!r})")
    keys = sorted({int(n.split(".")[1]) for n in names if n.startswith("experts.")})
    return CheckpointInfo(int(meta["hidden"]), tuple(keys), json.loads(meta.get("layers", "{}")))


def load_experts(path: str | Path, keys: Iterable[int] | None = None) -> tuple[int, dict[int, ExpertWeights]]:
    """``(hidden, key -> weights)`` for ``keys`` (all if None), reading only those tensors.

    A key the file does not hold raises ValueError naming it and the keys it does hold."""
    from safetensors import safe_open

    info = read_info(path)
    wanted = list(info.keys) if keys is None else sorted(set(keys))
    missing = sorted(set(wanted) - set(info.keys))
    if missing:
        raise ValueError(f"{path}: no expert keys {missing}; it holds {info.keys[0]}..{info.keys[-1]}"
                         if info.keys else f"{path}: holds no experts")
    out: dict[int, ExpertWeights] = {}
    with safe_open(str(path), framework="pt") as f:
        for k in wanted:
            out[k] = ExpertWeights(*(f.get_tensor(f"experts.{k}.{p}.weight").to(torch.float32) for p in _PROJ))
    return info.hidden, out
