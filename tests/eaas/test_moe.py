from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the eaas extra: pip install tokenomy[eaas]")
import torch.nn.functional as F

from tokenomy.eaas.config import preset
from tokenomy.eaas.moe import MoEWeights, reference_forward, route


def _per_token_forward(w: MoEWeights, x: torch.Tensor) -> torch.Tensor:
    """Independent, slow formulation: every token alone, written from the model definitions."""
    cfg = w.config
    rows = []
    for t in range(x.shape[0]):
        xt = x[t]
        logits = w.gate @ xt
        scores = torch.sigmoid(logits) if cfg.scoring == "sigmoid" else torch.softmax(logits, dim=0)
        top, ids = torch.topk(scores, cfg.top_k)
        if cfg.norm_topk_prob:
            top = top / top.sum()
        y = torch.zeros_like(xt)
        if w.shared is not None:
            s = w.shared
            y = y + s.w_down @ (F.silu(s.w_gate @ xt) * (s.w_up @ xt))
        for p, e in zip(top.tolist(), ids.tolist(), strict=True):
            ex = w.experts[e]
            y = y + p * cfg.routed_scaling * (ex.w_down @ (F.silu(ex.w_gate @ xt) * (ex.w_up @ xt)))
        rows.append(y)
    return torch.stack(rows)


@pytest.mark.parametrize("name", ["deepseek-tiny", "mixtral-tiny"])
def test_reference_forward_matches_a_per_token_formulation(name: str) -> None:
    w = MoEWeights.from_seed(preset(name), seed=3)
    x = torch.randn(17, w.config.hidden, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(reference_forward(w, x), _per_token_forward(w, x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["deepseek-tiny", "mixtral-tiny"])
def test_topk_weights_are_normalised(name: str) -> None:
    w = MoEWeights.from_seed(preset(name), seed=0)
    r = route(w, torch.randn(9, w.config.hidden))
    assert r.expert_ids.shape == (9, w.config.top_k)
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(9))


def test_a_server_builds_the_same_expert_from_the_seed_as_the_full_model() -> None:
    cfg = preset("deepseek-tiny")
    full, part = MoEWeights.from_seed(cfg, 5), MoEWeights.from_seed(cfg, 5, expert_ids=[3, 11])
    assert sorted(part.experts) == [3, 11]
    assert torch.equal(full.experts[11].w_down, part.experts[11].w_down)
    assert not torch.equal(full.experts[3].w_up, full.experts[4].w_up)


def test_safetensors_round_trip_gives_the_same_forward(tmp_path: Path) -> None:
    cfg = preset("mixtral-tiny")
    w = MoEWeights.from_seed(cfg, 2)
    path = tmp_path / "moe.safetensors"
    w.save_safetensors(path)
    loaded = MoEWeights.from_safetensors(cfg, path)
    x = torch.randn(5, cfg.hidden)
    assert torch.equal(loaded.gate, w.gate) and torch.equal(loaded.experts[7].w_down, w.experts[7].w_down)
    torch.testing.assert_close(reference_forward(loaded, x), reference_forward(w, x), atol=1e-6, rtol=0)
    assert sorted(MoEWeights.from_safetensors(cfg, path, expert_ids=[1]).experts) == [1]


def test_safetensors_errors_name_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "moe.safetensors"
    MoEWeights.from_seed(preset("mixtral-tiny"), 0).save_safetensors(path)
    with pytest.raises(ValueError, match="gate.weight has shape"):
        MoEWeights.from_safetensors(preset("mixtral-tiny", n_experts=4), path)
    with pytest.raises(ValueError, match="missing tensor 'shared_expert"):
        MoEWeights.from_safetensors(preset("deepseek-tiny", n_experts=8, top_k=2, moe_intermediate=128), path)
    with pytest.raises(FileNotFoundError):
        MoEWeights.from_safetensors(preset("mixtral-tiny"), tmp_path / "absent.safetensors")


def test_reference_forward_rejects_wrong_hidden_size() -> None:
    w = MoEWeights.from_seed(preset("mixtral-tiny"), 0)
    with pytest.raises(ValueError, match="expected hidden states"):
        reference_forward(w, torch.randn(3, 7))
