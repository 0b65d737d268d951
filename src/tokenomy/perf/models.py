"""Model shapes: a catalog of public architectures and derived sizes (params, KV bytes, FLOPs).

Every MLP is gated (SwiGLU: gate, up and down projections), as in all catalog models.
Parameter counts ignore norms and biases (< 0.1% of any catalog model).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenomy.core.errors import UnknownNameError


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture of a decoder-only transformer, as in its HF ``config.json``.

    MoE: ``n_experts > 0``; the first ``first_k_dense_layers`` layers use a dense MLP of
    ``intermediate_size``, the others route each token to ``n_active_experts`` of ``n_experts``
    experts of ``moe_intermediate_size`` plus ``n_shared_experts`` always-on experts.
    ``dtype_bytes`` is the activation and KV-cache element size; ``weight_bytes_per_param`` the
    stored weights' (None: ``dtype_bytes``), e.g. 1 for DeepSeek-V3, which ships in FP8.
    MLA (DeepSeek): ``kv_lora_rank > 0``; the KV cache holds one compressed latent of
    ``kv_lora_rank + qk_rope_head_dim`` values per token and layer, shared by all heads.
    ``max_context_tokens`` is the model's own context window (``max_position_embeddings``), what
    vLLM uses as ``max_model_len`` unless told otherwise.
    """

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    n_experts: int = 0
    n_active_experts: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0
    first_k_dense_layers: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    tie_word_embeddings: bool = False
    weight_bytes_per_param: float | None = None
    max_context_tokens: int | None = None  # config.json's max_position_embeddings; None: not known

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "dtype_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelSpec {self.name!r}: {name} must be > 0")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"ModelSpec {self.name!r}: n_heads {self.n_heads} not a multiple of n_kv_heads")
        if self.is_moe and not (0 < self.n_active_experts <= self.n_experts and self.moe_intermediate_size > 0):
            raise ValueError(f"ModelSpec {self.name!r}: MoE needs 0 < n_active_experts <= n_experts and moe_intermediate_size")
        if self.is_mla and self.qk_rope_head_dim + self.qk_nope_head_dim <= 0:
            raise ValueError(f"ModelSpec {self.name!r}: MLA needs qk_rope_head_dim/qk_nope_head_dim")

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def n_dense_layers(self) -> int:
        return self.first_k_dense_layers if self.is_moe else self.n_layers

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers

    # --- per-layer parameter counts -------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * self.n_heads * qk if self.q_lora_rank else h * self.n_heads * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv += self.kv_lora_rank * self.n_heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + self.n_heads * self.v_head_dim * h
        q_out = self.n_heads * self.head_dim
        return h * (q_out + 2 * self.n_kv_heads * self.head_dim) + q_out * h

    @property
    def dense_mlp_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """Parameters of one (routed or shared) expert."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.n_experts

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    # --- whole-model sizes ----------------------------------------------------------------
    @property
    def total_params(self) -> int:
        moe_layer = (self.n_experts + self.n_shared_experts) * self.expert_params + self.router_params_per_layer
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return (
            self.n_layers * self.attn_params_per_layer
            + self.n_dense_layers * self.dense_mlp_params_per_layer
            + self.n_moe_layers * moe_layer
            + self.embedding_params
            + head
        )

    @property
    def active_params(self) -> int:
        """Parameters that take part in one token's matmuls (excludes the embedding lookup)."""
        moe_layer = (self.n_active_experts + self.n_shared_experts) * self.expert_params + self.router_params_per_layer
        return (
            self.n_layers * self.attn_params_per_layer
            + self.n_dense_layers * self.dense_mlp_params_per_layer
            + self.n_moe_layers * moe_layer
            + self.lm_head_params
        )

    @property
    def weight_bytes(self) -> int:
        per_param = self.dtype_bytes if self.weight_bytes_per_param is None else self.weight_bytes_per_param
        return int(self.total_params * per_param)

    @property
    def kv_values_per_token_per_layer(self) -> int:
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers (GQA: K and V; MLA: the latent)."""
        return self.n_layers * self.kv_values_per_token_per_layer * self.dtype_bytes

    @property
    def linear_flops_per_token(self) -> float:
        """FLOPs of every matmul for one token, attention score/value products excluded."""
        return 2.0 * self.active_params

    @property
    def attn_flops_per_pair_per_layer(self) -> float:
        """FLOPs of QK^T plus PV for one query-key pair in one layer, all heads."""
        if self.is_mla:
            return 2.0 * self.n_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        return 4.0 * self.n_heads * self.head_dim


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
        from tokenomy.perf.hf_config import load_hf_config

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
