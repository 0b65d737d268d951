"""Read a local Hugging Face ``config.json`` into a ``ModelSpec``.

Understands the key names of Llama, Qwen2, Qwen3, Qwen3-MoE, Mixtral and DeepSeek-V3 configs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenomy.perf.model_spec import ModelSpec

# Weight element size of quantised checkpoints, by quantization_config.quant_method.
_QUANT_BYTES = {"fp8": 1.0, "fbgemm_fp8": 1.0, "compressed-tensors": 1.0, "mxfp4": 0.5}
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _int(cfg: dict[str, Any], path: Path, *keys: str, default: int | None = None) -> int:
    """First present key among ``keys`` as an int; ``default`` or a clear ValueError otherwise."""
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
                raise ValueError(f"{path}: {key!r} must be an integer, got {value!r}")
            return int(value)
    if default is not None:
        return default
    raise ValueError(f"{path}: missing required key {' or '.join(repr(k) for k in keys)}")


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Build a ``ModelSpec`` from a config.json (or a folder holding one).

    ``name`` defaults to the config's ``_name_or_path`` or the folder name. Raises
    ``FileNotFoundError`` if absent and ``ValueError`` naming any missing or malformed key.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no HF config at {path}")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object")

    hidden = _int(cfg, path, "hidden_size", "n_embd", "d_model")
    n_heads = _int(cfg, path, "num_attention_heads", "n_head")
    # HF's convention: configs without the key use multi-head attention.
    n_kv_heads = _int(cfg, path, "num_key_value_heads", default=n_heads)
    kv_lora_rank = _int(cfg, path, "kv_lora_rank", default=0)
    rope, nope = _int(cfg, path, "qk_rope_head_dim", default=0), _int(cfg, path, "qk_nope_head_dim", default=0)
    head_dim = rope + nope if kv_lora_rank else _int(cfg, path, "head_dim", default=hidden // n_heads)

    # Mixtral names its experts "local" and sizes them by intermediate_size.
    n_experts = _int(cfg, path, "n_routed_experts", "num_experts", "num_local_experts", default=0)
    moe_inter = 0
    if n_experts:
        moe_inter = _int(cfg, path, "moe_intermediate_size", "intermediate_size")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"{path}: unsupported torch_dtype {dtype!r}; known: {sorted(_DTYPE_BYTES)}")
    default_name = str(cfg.get("_name_or_path") or path.parent.name or path.stem)
    weight_bytes = _weight_bytes(cfg.get("quantization_config"), path)

    return ModelSpec(
        name=name or default_name,
        n_layers=_int(cfg, path, "num_hidden_layers", "n_layer", "num_layers"),
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        intermediate_size=_int(cfg, path, "intermediate_size", "ffn_hidden_size"),
        vocab_size=_int(cfg, path, "vocab_size"),
        dtype_bytes=_DTYPE_BYTES[dtype],
        n_experts=n_experts,
        n_active_experts=_int(cfg, path, "num_experts_per_tok", default=0) if n_experts else 0,
        n_shared_experts=_int(cfg, path, "n_shared_experts", default=0) if n_experts else 0,
        moe_intermediate_size=moe_inter,
        first_k_dense_layers=_int(cfg, path, "first_k_dense_replace", default=0) if n_experts else 0,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope if kv_lora_rank else 0,
        qk_nope_head_dim=nope if kv_lora_rank else 0,
        v_head_dim=_int(cfg, path, "v_head_dim", default=head_dim) if kv_lora_rank else 0,
        q_lora_rank=_int(cfg, path, "q_lora_rank", default=0) if kv_lora_rank else 0,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        weight_bytes_per_param=weight_bytes,
        max_context_tokens=_int(cfg, path, "max_position_embeddings", "n_positions", default=0) or None,
    )


def _weight_bytes(quant: Any, path: Path) -> float | None:
    """Bytes per stored weight from a ``quantization_config`` (None: the config's torch_dtype).

    ``bits`` (GPTQ, AWQ) wins when given; else the method's element size. An unknown method
    raises ValueError rather than silently sizing the weights at 16 bits."""
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise ValueError(f"{path}: quantization_config must be an object")
    bits = quant.get("bits") or quant.get("w_bit")
    if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0:
        return bits / 8
    method = str(quant.get("quant_method", ""))
    if method not in _QUANT_BYTES:
        raise ValueError(f"{path}: unsupported quant_method {method!r}; known: {sorted(_QUANT_BYTES)} or bits")
    return _QUANT_BYTES[method]
