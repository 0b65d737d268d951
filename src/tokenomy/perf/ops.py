"""Per-operator FLOPs and bytes of one dense transformer layer on one tensor-parallel rank.

The operator names are Vidur's, so calibration can compare each one with its measurement and
the step-time model prices a layer with exactly the operators that were calibrated.
Every cost is affine in the token count T: ``flops = flops_per_token * T`` and
``bytes = fixed_bytes + bytes_per_token * T`` (fixed bytes: the weights, read once per call).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenomy.perf.coefficients import Coefficients
from tokenomy.perf.hardware import GPUSpec

GEMM = "gemm"
ELEMENTWISE = "elementwise"


@dataclass(frozen=True, slots=True)
class OpCost:
    """``efficiency`` names the ``Coefficients`` field that scales HBM bandwidth for this op."""

    kind: str  # GEMM or ELEMENTWISE
    flops_per_token: float
    fixed_bytes: float
    bytes_per_token: float
    efficiency: str


def gemm(k: float, n: float, dtype_bytes: int) -> OpCost:
    """A [T, k] x [k, n] matmul: reads the weight and the input, writes the output."""
    return OpCost(GEMM, 2.0 * k * n, k * n * dtype_bytes, (k + n) * dtype_bytes, "memory_efficiency")


def elementwise(bytes_per_token: float, efficiency: str) -> OpCost:
    # One efficiency per kind of kernel: they differ by up to 3x in achieved bandwidth, and the
    # fitted value also absorbs what this simple byte count misses (caching, fused reads).
    return OpCost(ELEMENTWISE, 0.0, 0.0, bytes_per_token, efficiency)


def layer_ops(
    hidden: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    intermediate: int,
    tp: int,
    dtype_bytes: int = 2,
    gated_mlp: bool = True,
) -> dict[str, OpCost]:
    """Operators of one dense layer (attention kernel itself excluded) on one of ``tp`` ranks.

    Heads and the MLP width are split across ranks (Megatron TP); KV heads are replicated when
    ``tp`` exceeds their number, as vLLM does.
    """
    d = dtype_bytes
    q_out = n_heads * head_dim / tp
    kv_out = 2 * max(n_kv_heads / tp, 1.0) * head_dim
    mlp_in = (2 if gated_mlp else 1) * intermediate / tp
    return {
        "input_layernorm": elementwise(2 * hidden * d, "norm_efficiency"),
        "attn_pre_proj": gemm(hidden, q_out + kv_out, d),
        "attn_rope": elementwise(2 * (q_out + kv_out / 2) * d, "rope_efficiency"),
        "attn_post_proj": gemm(q_out, hidden, d),
        "post_attention_layernorm": elementwise(2 * hidden * d, "norm_efficiency"),
        "mlp_up_proj": gemm(hidden, mlp_in, d),
        "mlp_act": elementwise((mlp_in + intermediate / tp) * d, "activation_efficiency"),
        "mlp_down_proj": gemm(intermediate / tp, hidden, d),
        "add": elementwise(3 * hidden * d, "add_efficiency"),
    }


def embedding_op(hidden: int, dtype_bytes: int = 2) -> OpCost:
    """Token embedding lookup: reads one row per token and writes it."""
    return elementwise(2 * hidden * dtype_bytes, "embedding_efficiency")


def op_time_s(cost: OpCost, tokens: float, gpu: GPUSpec, coeffs: Coefficients) -> float:
    """Roofline time of one operator call: latency + max(compute time, memory time)."""
    memory = (cost.fixed_bytes + cost.bytes_per_token * tokens) / (
        gpu.hbm_bytes_per_s * getattr(coeffs, cost.efficiency)
    )
    if cost.kind == ELEMENTWISE:
        return coeffs.elementwise_latency_s + memory
    compute = cost.flops_per_token * tokens / (gpu.bf16_flops_per_s * coeffs.compute_efficiency)
    return coeffs.gemm_latency_s + max(compute, memory)


def allreduce_time_s(size_bytes: float, n_ranks: int, link_bytes_per_s: float, coeffs: Coefficients) -> float:
    """Ring all-reduce: each rank sends and receives 2 (n-1)/n of the buffer, plus a latency."""
    if n_ranks <= 1:
        return 0.0
    ring = 2.0 * (n_ranks - 1) / n_ranks
    return coeffs.allreduce_latency_s + ring * size_bytes / (link_bytes_per_s * coeffs.allreduce_efficiency)
