"""A stand-in for the attention side's local compute, and the reference stack built from it.

EAAS keeps attention on the client. Our tiny model has no attention, so the client's per-layer local
work is a deterministic dense mixer of configurable width: it costs real CPU time (which dual-batch
overlap must hide the expert round trip behind) and changes the hidden states, so a stack of
``mixer + MoE`` layers checks that the overlapped schedule computes exactly what the serial one does.
The stack reuses one MoE block at every layer (weight tying) so servers host one set of experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tokenomy.eaas.moe import MoEWeights, reference_forward


@dataclass(frozen=True)
class LocalMixer:
    """``h -> tanh(h W1^T) W2^T * 0.1``; ``width`` sets its cost (FLOPs ~ 4 * tokens * hidden * width)."""

    w1: torch.Tensor
    w2: torch.Tensor

    @classmethod
    def from_seed(cls, hidden: int, width: int, seed: int = 0) -> LocalMixer:
        if hidden < 1 or width < 1:
            raise ValueError(f"LocalMixer needs hidden >= 1 and width >= 1, got {hidden}, {width}")
        g = torch.Generator().manual_seed(seed + 7_777_777)
        return cls(torch.randn(width, hidden, generator=g) * hidden**-0.5,
                   torch.randn(hidden, width, generator=g) * width**-0.5)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.tanh(F.linear(h, self.w1)), self.w2) * 0.1


def rms_norm(h: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Pre-norm as in DeepSeek/Mixtral blocks (no learned scale): keeps a deep residual stack finite."""
    return h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)


def reference_stack(weights: MoEWeights, mixer: LocalMixer, x: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Monolithic ``n_layers`` of ``h += mixer(norm(h)); h += moe(norm(h))``: ground truth for
    ``AttentionClient.forward_layers``."""
    h = x
    for _ in range(n_layers):
        h = h + mixer(rms_norm(h))
        h = h + reference_forward(weights, rms_norm(h))
    return h
