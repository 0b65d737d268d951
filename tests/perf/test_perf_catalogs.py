"""GPU and model catalogs: lookups, aliases, unknown names, user overrides, derived sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.perf import get_gpu, get_model, gpu_names, load_gpu_catalog, model_names


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("H100-SXM", "H100-SXM"), ("h100", "H100-SXM"), ("A100", "A100-80GB"), ("a100-80gb", "A100-80GB"),
     ("h200", "H200"), ("H20", "H20"), ("l40s", "L40S"), ("ascend-910b", "Ascend-910B"), ("910b", "Ascend-910B")],
)
def test_get_gpu_is_case_insensitive_and_knows_aliases(name: str, canonical: str) -> None:
    assert get_gpu(name).name == canonical


def test_unknown_gpu_lists_known_names() -> None:
    with pytest.raises(KeyError) as err:
        get_gpu("tpu-v5")
    for name in gpu_names():
        assert name in str(err.value)


def test_catalog_uses_dense_bf16_peaks() -> None:
    # Spec sheets quote 2x with 2:4 sparsity; the catalog must hold the dense figure.
    assert get_gpu("h100").bf16_flops_per_s == pytest.approx(989.4e12)
    assert get_gpu("a100").bf16_flops_per_s == pytest.approx(312e12)
    assert get_gpu("h20").bf16_flops_per_s < get_gpu("a100").bf16_flops_per_s < get_gpu("h100").bf16_flops_per_s
    assert get_gpu("h200").memory_bytes > get_gpu("h100").memory_bytes


def test_load_gpu_catalog_overrides_price_and_adds_a_gpu(tmp_path: Path) -> None:
    original = get_gpu("L40S")
    new = {"name": "Test-GPU", "bf16_flops_per_s": 1e14, "hbm_bytes_per_s": 1e12, "memory_bytes": 24e9,
           "intra_node_bytes_per_s": 3e10, "inter_node_bytes_per_s": 1e10, "pcie_bytes_per_s": 3e10,
           "usd_per_gpu_hour": 0.5}
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{"name": "l40s", "usd_per_gpu_hour": 0.77}, new]))
    try:
        loaded = load_gpu_catalog(path)
        assert [g.name for g in loaded] == ["L40S", "Test-GPU"]
        assert get_gpu("L40S").usd_per_gpu_hour == 0.77
        assert get_gpu("L40S").hbm_bytes_per_s == original.hbm_bytes_per_s
        assert get_gpu("test-gpu").memory_bytes == 24e9
    finally:  # the catalog is process-wide: restore it for other tests
        path.write_text(json.dumps([{"name": "L40S", "usd_per_gpu_hour": original.usd_per_gpu_hour}]))
        load_gpu_catalog(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "not valid JSON"), ('[{"name": "X1"}]', "missing fields"),
     ('[{"name": "H100", "flops": 1}]', "unknown fields"), ('[{"usd_per_gpu_hour": 1}]', "needs a string 'name'"),
     ('[{"name": "H100", "usd_per_gpu_hour": -1}]', "must be > 0")],
)
def test_load_gpu_catalog_rejects_bad_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_gpu_catalog(path)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "meta-llama/Llama-3.1-8B", "LLAMA-3.1-8B"])
def test_get_model_is_case_insensitive_and_ignores_org(name: str) -> None:
    assert get_model(name).name == "Llama-3.1-8B"


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(KeyError) as err:
        get_model("gpt-5")
    assert all(name in str(err.value) for name in model_names())


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    # Published sizes: 8.0B, 70.6B, 32.8B, 30.5B/3.3B active (incl. embeddings), 671B/37B active.
    [("Llama-3.1-8B", 8.03, 7.5), ("Llama-3.1-70B", 70.6, 69.5), ("Qwen3-32B", 32.8, 32.0),
     ("Qwen3-30B-A3B", 30.5, 3.0), ("DeepSeek-V3", 671.0, 36.6), ("Llama-2-7B", 6.74, 6.6)],
)
def test_parameter_counts_match_published_sizes(name: str, total_b: float, active_b: float) -> None:
    m = get_model(name)
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=0.01)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.02)
    assert m.weight_bytes == (1 if name == "DeepSeek-V3" else 2) * m.total_params  # DeepSeek-V3 ships in FP8


@pytest.mark.parametrize(
    ("name", "kv_bytes"),
    [("Llama-3.1-8B", 131072),  # 2 * 32 layers * 8 kv heads * 128 * 2 B
     ("Llama-3.1-70B", 327680),
     ("Llama-2-7B", 524288),  # MHA: 32 kv heads
     ("DeepSeek-V3", 61 * (512 + 64) * 2)],  # MLA latent, shared by all 128 heads
)
def test_kv_bytes_per_token(name: str, kv_bytes: int) -> None:
    assert get_model(name).kv_bytes_per_token == kv_bytes


def test_vidur_profiled_models_are_in_the_catalog() -> None:
    for name in ("Llama-2-7B", "Llama-2-70B", "Llama-3-8B", "Llama-3-70B", "Qwen-72B", "InternLM-20B",
                 "CodeLlama-34B"):
        assert get_model(name).name == name


def test_every_catalog_gpu_carries_its_source() -> None:
    from tokenomy.perf import get_gpu, gpu_names

    for name in gpu_names():  # (another test may have overridden a price from a file: then it says so)
        assert get_gpu(name).source
    for name in ("h100", "h200", "h20", "a100"):
        assert "datasheet" in get_gpu(name).source or "product brief" in get_gpu(name).source
        assert "Price: labelled default" in get_gpu(name).source
    assert "148 TFLOPS" in get_gpu("h20").source and "96 GB" in get_gpu("h20").source
