"""``tokenomy model tiny DIR``: a small random Llama that real vLLM serves on a CPU, with no download.

The directory is a Hugging Face model folder: ``config.json`` (``LlamaForCausalLM``: hidden 256,
4 layers, 4 heads, 2 KV heads, 4,096 positions), ``model.safetensors`` (float32 weights drawn from
N(0, 0.02) by a seeded generator; norms are 1), ``generation_config.json``, and a byte-level BPE
``tokenizer.json`` trained on the spot on generated English text, with a Llama-3-style chat
template in ``tokenizer_config.json``. The same seed gives byte-identical files. About 18 MB.

Its answers are noise (random weights): greedy decoding often emits the end-of-turn token at
once, so callers that need tokens ask for ``ignore_eos`` and ``max_tokens``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
"""Llama 3's chat layout, with string contents."""

SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>")
"""Ids 0-4 of the vocabulary, in this order."""

_CORPUS_WORDS = """the of and to in is that for it as with was on be by this are or from at an not have which but
    all can has more one will were their been also time new some would other into only most first any about
    over may such then them these two our out could when like what so its than many used each where just
    well way very because between those both through after much under while might same before three here
    since great still long against part little own world year work made during number people water found
    state small large point order place case form group system value model data cache block answer result
    query search table method note city river house paper music light field plant night power money story
    study market school family health door window road car train book page line word letter voice color
    green blue red black white north south east west early late open close start end high low short strong
    simple clear easy hard real true free full user assistant tool call function question please thanks
    hello you we they he she i me my your his her code file error test run build server request token"""


@dataclass(frozen=True)
class TinyLlama:
    """Shape of the tiny model (the defaults are what ``tokenomy model tiny`` builds)."""

    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 4096
    vocab_size: int = 4096
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def _corpus(seed: int) -> list[str]:
    """Seeded English-looking lines: sentences of common words, numbers and punctuation."""
    rng = np.random.default_rng([seed, 17])
    words = _CORPUS_WORDS.split()
    lines = []
    for _ in range(4000):
        n = int(rng.integers(4, 24))
        picked = [words[int(i)] for i in rng.integers(0, len(words), n)]
        picked[0] = picked[0].capitalize()
        if rng.random() < 0.3:
            picked.insert(int(rng.integers(0, n)), str(int(rng.integers(0, 10_000))))
        lines.append(" ".join(picked) + str(rng.choice([".", "?", "!", ":", ","])))
    return lines


def build_tokenizer(shape: TinyLlama) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` with the special tokens at ids 0-4."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    except ImportError:
        raise ValueError("building the tiny model needs `tokenizers` (pip install 'tokenomy[model]')") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=shape.vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(shape.seed), trainer)
    return tok


def _weights(shape: TinyLlama, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([shape.seed, 1])
    h, kv, inter = shape.hidden_size, shape.num_kv_heads * shape.head_dim, shape.intermediate_size

    def normal(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)).astype(np.float32)

    out = {"model.embed_tokens.weight": normal(vocab, h), "model.norm.weight": np.ones(h, np.float32),
           "lm_head.weight": normal(vocab, h)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": normal(h, h), p + "self_attn.k_proj.weight": normal(kv, h),
                p + "self_attn.v_proj.weight": normal(kv, h), p + "self_attn.o_proj.weight": normal(h, h),
                p + "mlp.gate_proj.weight": normal(inter, h), p + "mlp.up_proj.weight": normal(inter, h),
                p + "mlp.down_proj.weight": normal(h, inter),
                p + "input_layernorm.weight": np.ones(h, np.float32),
                p + "post_attention_layernorm.weight": np.ones(h, np.float32)}
    return out


def build_tiny_model(out_dir: Path, shape: TinyLlama | None = None) -> Path:
    """Write the tiny model folder (created if missing; files in it are replaced); returns it."""
    shape = shape or TinyLlama()
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise ValueError("building the tiny model needs `safetensors` (pip install 'tokenomy[model]')") from None
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir}: exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(shape)
    vocab = tok.get_vocab_size()
    bos, eos, eot = (tok.token_to_id(t) for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"))
    tok.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>", "model_max_length": shape.max_positions,
        "add_bos_token": False, "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
    })
    _write_json(out_dir / "special_tokens_map.json", {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>"})
    _write_json(out_dir / "config.json", {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size, "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim, "max_position_embeddings": shape.max_positions, "vocab_size": vocab,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02, "torch_dtype": "float32",
        "bos_token_id": bos, "eos_token_id": [eos, eot], "pad_token_id": eos,
    })
    _write_json(out_dir / "generation_config.json", {"bos_token_id": bos, "eos_token_id": [eos, eot]})
    save_file(_weights(shape, vocab), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
