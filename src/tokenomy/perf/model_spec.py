"""The shape of a decoder-only transformer and the sizes derived from it (params, KV bytes, FLOPs).

Every MLP is gated (SwiGLU: gate, up and down projections), as in all catalog models.
Parameter counts ignore norms and biases (< 0.1% of any catalog model).
"""

from __future__ import annotations

from dataclasses import dataclass


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
