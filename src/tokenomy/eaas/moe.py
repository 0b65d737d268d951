"""The MoE block: gate, SwiGLU experts, shared expert, and the monolithic reference forward.

Weights come from a seed (each component from its own generator, so a server can build only the
experts it hosts and still agree bit-for-bit with every other process) or from a local safetensors
file with keys ``gate.weight``, ``experts.{e}.{gate,up,down}_proj.weight`` and
``shared_expert.{gate,up,down}_proj.weight``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tokenomy.eaas.config import MoEConfig

_PROJ = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ExpertWeights:
    """One SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``; shapes [I,H], [I,H], [H,I]."""

    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.w_gate)) * F.linear(x, self.w_up), self.w_down)


@dataclass(frozen=True)
class Routing:
    """Gate decision for a batch: ``expert_ids`` and combine ``weights``, both [tokens, top_k]."""

    expert_ids: torch.Tensor
    weights: torch.Tensor


def _component_generator(seed: int, component: int) -> torch.Generator:
    # One generator per component: expert e's weights do not depend on which others are built.
    return torch.Generator().manual_seed(seed * 1_000_003 + component)


def _random_expert(cfg: MoEConfig, inner: int, seed: int, component: int) -> ExpertWeights:
    g = _component_generator(seed, component)
    std_in, std_out = cfg.hidden**-0.5, inner**-0.5
    return ExpertWeights(
        w_gate=torch.randn(inner, cfg.hidden, generator=g) * std_in,
        w_up=torch.randn(inner, cfg.hidden, generator=g) * std_in,
        w_down=torch.randn(cfg.hidden, inner, generator=g) * std_out,
    )


def seeded_expert(cfg: MoEConfig, seed: int, expert_id: int) -> ExpertWeights:
    """Routed expert ``expert_id`` as built from ``seed`` (same in every process)."""
    if not 0 <= expert_id < cfg.n_experts:
        raise ValueError(f"expert id {expert_id} out of range 0..{cfg.n_experts - 1}")
    return _random_expert(cfg, cfg.moe_intermediate, seed, 2 + expert_id)


@dataclass(frozen=True)
class MoEWeights:
    """All weights of one block. ``experts`` maps expert id -> weights (a server may hold a subset)."""

    config: MoEConfig
    gate: torch.Tensor
    experts: dict[int, ExpertWeights]
    shared: ExpertWeights | None

    @classmethod
    def from_seed(cls, cfg: MoEConfig, seed: int, expert_ids: Iterable[int] | None = None) -> MoEWeights:
        ids = range(cfg.n_experts) if expert_ids is None else expert_ids
        gate = torch.randn(cfg.n_experts, cfg.hidden, generator=_component_generator(seed, 0)) * cfg.hidden**-0.5
        shared = None
        if cfg.n_shared_experts:
            shared = _random_expert(cfg, cfg.moe_intermediate * cfg.n_shared_experts, seed, 1)
        return cls(cfg, gate, {e: seeded_expert(cfg, seed, e) for e in ids}, shared)

    @classmethod
    def from_safetensors(cls, cfg: MoEConfig, path: str | Path,
                         expert_ids: Iterable[int] | None = None) -> MoEWeights:
        """Load from a local file; missing keys or wrong shapes raise ValueError naming the key."""
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"weights file not found: {path}")
        tensors = load_file(str(path))
        shared_inner = cfg.moe_intermediate * cfg.n_shared_experts

        def get(key: str, shape: tuple[int, ...]) -> torch.Tensor:
            if key not in tensors:
                raise ValueError(f"{path}: missing tensor {key!r}")
            t = tensors[key].to(torch.float32)
            if tuple(t.shape) != shape:
                raise ValueError(f"{path}: {key} has shape {tuple(t.shape)}, config expects {shape}")
            return t

        def expert(prefix: str, inner: int) -> ExpertWeights:
            h = cfg.hidden
            shapes = ((inner, h), (inner, h), (h, inner))
            return ExpertWeights(*(get(f"{prefix}.{p}.weight", s) for p, s in zip(_PROJ, shapes, strict=True)))

        ids = range(cfg.n_experts) if expert_ids is None else expert_ids
        experts = {e: expert(f"experts.{e}", cfg.moe_intermediate) for e in ids}
        shared = expert("shared_expert", shared_inner) if cfg.n_shared_experts else None
        return cls(cfg, get("gate.weight", (cfg.n_experts, cfg.hidden)), experts, shared)

    def save_safetensors(self, path: str | Path) -> None:
        """Write every weight this object holds in the layout ``from_safetensors`` reads."""
        from safetensors.torch import save_file

        out: dict[str, torch.Tensor] = {"gate.weight": self.gate.contiguous()}
        named = [(f"experts.{e}", w) for e, w in self.experts.items()]
        if self.shared is not None:
            named.append(("shared_expert", self.shared))
        for prefix, w in named:
            for proj, t in zip(_PROJ, (w.w_gate, w.w_up, w.w_down), strict=True):
                out[f"{prefix}.{proj}.weight"] = t.contiguous()
        save_file(out, str(path))


def route(weights: MoEWeights, x: torch.Tensor) -> Routing:
    """Top-k gate over ``x`` [tokens, hidden] (DeepSeek: sigmoid; Mixtral: softmax), renormalised if set."""
    cfg = weights.config
    logits = F.linear(x, weights.gate)
    scores = torch.sigmoid(logits) if cfg.scoring == "sigmoid" else torch.softmax(logits, dim=-1)
    top, ids = torch.topk(scores, cfg.top_k, dim=-1)
    if cfg.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return Routing(expert_ids=ids, weights=top * cfg.routed_scaling)


def shared_forward(weights: MoEWeights, x: torch.Tensor) -> torch.Tensor:
    """Shared-expert output (zeros when the config has none)."""
    return weights.shared(x) if weights.shared is not None else torch.zeros_like(x)


def reference_forward(weights: MoEWeights, x: torch.Tensor) -> torch.Tensor:
    """Monolithic forward of the block: every expert in this process. The ground truth for EAAS."""
    if x.ndim != 2 or x.shape[1] != weights.config.hidden:
        raise ValueError(f"expected hidden states [tokens, {weights.config.hidden}], got {tuple(x.shape)}")
    r = route(weights, x)
    out = shared_forward(weights, x)
    for e in torch.unique(r.expert_ids).tolist():
        tok, slot = (r.expert_ids == e).nonzero(as_tuple=True)
        y = weights.experts[e](x[tok]) * r.weights[tok, slot].unsqueeze(-1)
        out = out.index_add(0, tok, y)
    return out
