from __future__ import annotations

import pytest

from tokenomy.eaas.config import PRESETS, MoEConfig, preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_named(name: str) -> None:
    cfg = preset(name)
    assert cfg.top_k <= cfg.n_experts


def test_deepseek_and_mixtral_styles_differ_where_the_families_do() -> None:
    ds, mx = preset("deepseek-tiny"), preset("mixtral-tiny")
    assert (ds.scoring, ds.n_shared_experts) == ("sigmoid", 1)
    assert (mx.scoring, mx.n_shared_experts, mx.top_k) == ("softmax", 0, 2)


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="deepseek-tiny.*mixtral-tiny"):
        preset("gpt-tiny")


def test_preset_overrides() -> None:
    assert preset("mixtral-tiny", top_k=1).top_k == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hidden": 0}, "hidden"),
        ({"top_k": 9}, "exceeds n_experts"),
        ({"n_shared_experts": -1}, "n_shared_experts"),
        ({"scoring": "relu"}, "unknown scoring"),
        ({"routed_scaling": 0.0}, "routed_scaling"),
    ],
)
def test_bad_config_is_rejected_with_the_field_named(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"hidden": 8, "moe_intermediate": 4, "n_experts": 8, "top_k": 2}
    with pytest.raises(ValueError, match=message):
        MoEConfig(**{**base, **kwargs})  # type: ignore[arg-type]
