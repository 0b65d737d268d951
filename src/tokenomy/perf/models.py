"""The model catalog: public architectures by name (:class:`ModelSpec` shapes), or a local
Hugging Face ``config.json`` (:mod:`tokenomy.perf.hf_config`)."""

from __future__ import annotations

from pathlib import Path

from tokenomy.core.errors import UnknownNameError
from tokenomy.perf.hf_config import load_hf_config
from tokenomy.perf.model_spec import ModelSpec


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int,
           context: int | None = None) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv, hidden // heads, inter, vocab, max_context_tokens=context)


# Numbers from each model's public Hugging Face config.json.
_CATALOG: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _llama("Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256, 131072),
        _llama("Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256, 131072),
        _llama("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("Llama-3-70B", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("CodeLlama-34B", 48, 8192, 64, 8, 22016, 32000, 16384),
        _llama("InternLM-20B", 60, 5120, 40, 40, 13824, 103168),
        # Qwen (v1) config.json gives intermediate_size 49152 = 2 x the gated width of 24576.
        _llama("Qwen-72B", 80, 8192, 64, 64, 24576, 152064),
        ModelSpec("Qwen3-32B", 64, 5120, 64, 8, 128, 25600, 151936, max_context_tokens=40960),
        ModelSpec(
            "Qwen3-30B-A3B", 48, 2048, 32, 4, 128, 6144, 151936,
            n_experts=128, n_active_experts=8, moe_intermediate_size=768, max_context_tokens=40960,
        ),
        ModelSpec(
            "DeepSeek-V3", 61, 7168, 128, 128, 192, 18432, 129280,
            n_experts=256, n_active_experts=8, n_shared_experts=1, moe_intermediate_size=2048,
            first_k_dense_layers=3, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
            v_head_dim=128, q_lora_rank=1536, weight_bytes_per_param=1,  # released in FP8 (e4m3)
            max_context_tokens=163840,
        ),
    )
}

_ALIASES = {
    "llama-2-7b-hf": "Llama-2-7B",
    "llama-2-70b-hf": "Llama-2-70B",
    "meta-llama-3-8b": "Llama-3-8B",
    "meta-llama-3-70b": "Llama-3-70B",
    "codellama-34b-instruct-hf": "CodeLlama-34B",
    "deepseek-r1": "DeepSeek-V3",
}


def model_names() -> list[str]:
    return sorted(_CATALOG)


def get_model(name: str) -> ModelSpec:
    """Look a model up by name (an ``org/`` prefix is ignored), case-insensitively, or read a
    Hugging Face ``config.json`` (a path to the file or to a folder holding one).

    Raises ``UnknownNameError`` (a ValueError and KeyError) naming every known model when ``name`` is unknown, ValueError for a
    config file it cannot read.
    """
    path = Path(name)
    if name.endswith(".json") or path.is_dir():
        try:
            return load_hf_config(path)
        except FileNotFoundError as exc:
            raise ValueError(f"--model {name}: {exc}") from None
    key = name.strip().rsplit("/", 1)[-1].lower()
    for canonical, spec in _CATALOG.items():
        if canonical.lower() == key:
            return spec
    if key in _ALIASES:
        return _CATALOG[_ALIASES[key]]
    raise UnknownNameError(f"unknown model {name!r}; known: {', '.join(model_names())}")
