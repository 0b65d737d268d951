"""``tokenomy model tiny DIR``: a Hugging Face Llama folder, the same bytes for the same seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenomy.cli.main import main
from tokenomy.perf.hf_config import load_hf_config

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")


def test_tiny_model_is_a_llama_folder_with_a_chat_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "tiny", str(tmp_path / "m")]) == 0
    assert "tiny Llama in" in capsys.readouterr().out
    out = tmp_path / "m"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (256, 4, 2)
    assert load_hf_config(out / "config.json").n_layers == 4  # our perf model reads it too

    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == cfg["vocab_size"]
    weights = load_file(str(out / "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape == (cfg["vocab_size"], 256)
    assert weights["model.layers.3.self_attn.k_proj.weight"].shape == (128, 256)  # 2 KV heads x 64
    text = "Hello world, the answer is 42."
    assert tok.decode(tok.encode(text).ids) == text  # byte-level: lossless
    assert len(tok.encode(" the model")) == 2  # common words are one token each
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    assert "<|start_header_id|>" in tcfg["chat_template"]
    assert tok.token_to_id(tcfg["eos_token"]) in cfg["eos_token_id"]


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        assert main(["model", "tiny", str(tmp_path / name), "--seed", seed]) == 0
    read = {n: (tmp_path / n / "model.safetensors").read_bytes() for n in "abc"}
    assert read["a"] == read["b"] != read["c"]
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()


def test_bad_arguments_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("x")
    assert main(["model", "tiny", str(tmp_path / "f")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert main(["model", "tiny", str(tmp_path / "d"), "--vocab-size", "10"]) == 2
    assert "--vocab-size must be at least" in capsys.readouterr().err
