"""Loading a local HF config.json for dense, MoE and MLA architectures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokenomy.perf import get_model, load_hf_config

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "torch_dtype": "bfloat16", "tie_word_embeddings": False, "max_position_embeddings": 131072}
QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
             "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 4, "head_dim": 128,
             "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
             "torch_dtype": "bfloat16", "max_position_embeddings": 40960}
MIXTRAL = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
               "num_attention_heads": 128, "num_hidden_layers": 61, "num_key_value_heads": 128,
               "vocab_size": 129280, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
               "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "kv_lora_rank": 512,
               "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
               "torch_dtype": "bfloat16", "max_position_embeddings": 163840,
               "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                       "weight_block_size": [128, 128]}}


def _write(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    ("cfg", "catalog_name"),
    [(LLAMA_8B, "Llama-3.1-8B"), (QWEN3_MOE, "Qwen3-30B-A3B"), (DEEPSEEK_V3, "DeepSeek-V3")],
)
def test_loaded_config_matches_the_catalog_entry(tmp_path: Path, cfg: dict[str, Any], catalog_name: str) -> None:
    loaded = load_hf_config(_write(tmp_path, cfg), name=catalog_name)
    assert loaded == get_model(catalog_name)


def test_mixtral_experts_use_intermediate_size(tmp_path: Path) -> None:
    m = load_hf_config(_write(tmp_path, MIXTRAL))
    assert (m.n_experts, m.n_active_experts, m.moe_intermediate_size) == (8, 2, 14336)
    assert m.total_params / 1e9 == pytest.approx(46.7, rel=0.01)  # Mixtral-8x7B
    assert m.active_params / 1e9 == pytest.approx(12.9, rel=0.02)


def test_folder_and_default_name(tmp_path: Path) -> None:
    folder = tmp_path / "my-llama"
    folder.mkdir()
    _write(folder, LLAMA_8B)
    assert load_hf_config(folder).name == "my-llama"


def test_mla_kv_is_the_latent(tmp_path: Path) -> None:
    m = load_hf_config(_write(tmp_path, DEEPSEEK_V3))
    assert m.is_mla and m.kv_bytes_per_token == 61 * 576 * 2


@pytest.mark.parametrize("missing", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"])
def test_missing_key_is_a_clear_error(tmp_path: Path, missing: str) -> None:
    cfg = {k: v for k, v in LLAMA_8B.items() if k != missing}
    with pytest.raises(ValueError, match=f"missing required key '{missing}'"):
        load_hf_config(_write(tmp_path, cfg))


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_hf_config(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="integer"):
        load_hf_config(_write(tmp_path, dict(LLAMA_8B, hidden_size="big")))
    with pytest.raises(ValueError, match="torch_dtype"):
        load_hf_config(_write(tmp_path, dict(LLAMA_8B, torch_dtype="int3")))
