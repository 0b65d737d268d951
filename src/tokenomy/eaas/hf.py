"""Serve the routed experts of a ``transformers`` MoE model with EAAS.

The split is the paper's: the attention side (embeddings, attention, norms, KV cache, the MoE gate
and any shared expert) stays in the client process and runs as ``transformers`` wrote it; only each
MoE layer's *routed experts* module is replaced by ``RemoteExperts``, a drop-in with the same call
``experts(hidden_states [T,H], top_k_index [T,K], top_k_weights [T,K]) -> [T,H]`` that sends each
expert's tokens to an expert server through ``ExpertDispatcher`` (replicas, failover). The model's
own ``generate`` then runs unchanged.

Supported: experts modules in the fused layout ``transformers`` >= 5 uses for DeepSeek-V3, Qwen3-MoE,
Mixtral and others (``gate_up_proj`` [E, 2I, H] with gate rows first, ``down_proj`` [E, H, I], no
bias, SiLU). ``find_expert_layers`` refuses anything else with the module's name and the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tokenomy.eaas.checkpoint import save_experts
from tokenomy.eaas.dispatch import ExpertDispatcher
from tokenomy.eaas.moe import ExpertWeights

_LAYOUT_FLAGS = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
                 "has_post_expert_norm": False}
_SILU = ("silu", "swish")


@dataclass(frozen=True)
class ExpertLayer:
    """One MoE layer's routed experts: module ``name``, ``n_experts``, and the key of its expert 0
    (expert e of this layer is key ``key_offset + e`` on the wire and in the registry)."""

    name: str
    n_experts: int
    key_offset: int

    def keys(self) -> range:
        return range(self.key_offset, self.key_offset + self.n_experts)


def _fused(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(gate_up_proj, down_proj)`` if ``m`` is an experts module in the fused layout."""
    gu, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
    if isinstance(gu, nn.Parameter) and isinstance(down, nn.Parameter) and gu.ndim == 3:
        return gu.detach(), down.detach()
    return None


def _check_layout(name: str, m: nn.Module, gate_up: torch.Tensor, down: torch.Tensor) -> None:
    for flag, want in _LAYOUT_FLAGS.items():
        if getattr(m, flag, want) != want:
            raise ValueError(f"{name}: experts with {flag}={getattr(m, flag)} are not supported (need {want})")
    act = getattr(getattr(m, "config", None), "hidden_act", "silu")
    if act not in _SILU:
        raise ValueError(f"{name}: activation {act!r} is not supported (SwiGLU experts need silu)")
    e, two_i, h = gate_up.shape
    if two_i % 2 or tuple(down.shape) != (e, h, two_i // 2):
        raise ValueError(f"{name}: gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)} "
                         "are not [E, 2I, H] and [E, H, I]")


def find_expert_layers(model: nn.Module) -> list[ExpertLayer]:
    """Every routed-experts module of ``model`` in module order, with consecutive key ranges.

    Raises ValueError if there is none or one has a layout EAAS cannot serve."""
    layers: list[ExpertLayer] = []
    offset = 0
    for name, m in model.named_modules():
        if isinstance(m, RemoteExperts):
            raise ValueError(f"{name}: experts are already remote")
        fused = _fused(m)
        if fused is not None:
            _check_layout(name, m, *fused)
            n = int(fused[0].shape[0])
            layers.append(ExpertLayer(name, n, offset))
            offset += n
    if not layers:
        raise ValueError(f"{type(model).__name__} has no routed-experts module (gate_up_proj/down_proj [E, ...])")
    return layers


def _iter_experts(model: nn.Module, layers: list[ExpertLayer]) -> Iterator[tuple[int, ExpertWeights]]:
    for layer in layers:
        fused = _fused(model.get_submodule(layer.name))
        assert fused is not None  # find_expert_layers found it
        gate_up, down = fused
        inner = gate_up.shape[1] // 2
        for e in range(layer.n_experts):
            yield layer.key_offset + e, ExpertWeights(gate_up[e, :inner], gate_up[e, inner:], down[e])


def save_expert_checkpoint(model: nn.Module, path: str | Path) -> list[ExpertLayer]:
    """Write every routed expert of ``model`` to one expert checkpoint (see ``checkpoint.py``)."""
    layers = find_expert_layers(model)
    save_experts(path, dict(_iter_experts(model, layers)), {ly.name: ly.key_offset for ly in layers})
    return layers


class RemoteExperts(nn.Module):
    """Drop-in for a ``transformers`` experts module whose experts live on expert servers."""

    def __init__(self, dispatcher: ExpertDispatcher, layer: ExpertLayer) -> None:
        super().__init__()
        self.dispatcher, self.layer = dispatcher, layer

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            pending = self.dispatcher.submit(hidden_states, top_k_index, top_k_weights,
                                             self.layer.key_offset, self.layer.n_experts)
            return pending.result()

    def extra_repr(self) -> str:
        return f"{self.layer.name}, experts={self.layer.n_experts}, keys={self.layer.key_offset}.."


def attach_remote_experts(model: nn.Module, dispatcher: ExpertDispatcher) -> list[ExpertLayer]:
    """Replace every routed-experts module of ``model`` by ``RemoteExperts``; their weights leave this
    process (the servers must host the keys ``save_expert_checkpoint`` gave them)."""
    layers = find_expert_layers(model)
    for layer in layers:
        parent_name, _, attr = layer.name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, RemoteExperts(dispatcher, layer))
    return layers
