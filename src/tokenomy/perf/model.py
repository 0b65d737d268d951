"""Step-time model of one engine instance: a model on ``tp`` GPUs, priced per mixed batch.

Every layer is the sum of its kernels, each a roofline ``latency + max(FLOPs / (peak * eff),
bytes / (HBM * eff))`` with the operators and efficiencies of ``ops``/``coefficients`` (so
calibrated kernels are priced exactly as calibrated). ``step_time_s`` is the simulator's hot path:
every constant is folded in ``__init__`` so a call is a few dozen float operations.
"""

from __future__ import annotations

import math
from dataclasses import fields

from mypy_extensions import mypyc_attr

from tokenomy.core.step import StepShape
from tokenomy.perf.coefficients import Coefficients, shipped_coefficients
from tokenomy.perf.hardware import GPUSpec, get_gpu
from tokenomy.perf.model_spec import ModelSpec
from tokenomy.perf.models import get_model
from tokenomy.perf.ops import ELEMENTWISE, OpCost, embedding_op, gemm, layer_ops

# Per-GPU memory kept free of KV cache for activations, CUDA graphs and the allocator (a default
# in line with what vLLM's profiling run leaves for an 8k-token batch on a mid-size model).
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * 2**30

# Uncalibrated GPUs borrow the fitted efficiencies of a calibrated GPU of the same architecture.
_CALIBRATION_PROXY = {"H200": "H100-SXM", "H20": "H100-SXM"}

_Gemm = tuple[float, float, float]  # (s per token compute, s fixed memory, s per token memory)


def _gemm_s(lat: float, ac: float, m0: float, m1: float, t: int) -> float:
    """A GEMM of ``t`` tokens: its latency plus the longer of its compute and its memory time."""
    cc = ac * t
    mm = m0 + m1 * t
    return lat + (cc if cc > mm else mm)


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (tokenomy._native); users subclass it
class PerfModel:
    """``tokenomy.core.StepTimeModel`` for ``model`` on ``tp`` GPUs of one kind.

    Raises ``ValueError`` when ``tp`` does not divide the attention heads.
    """

    __slots__ = (
        "model", "gpu", "tp", "coeffs", "_kv_shard", "_moe_gemms",
        "_qkv_c", "_qkv_m0", "_qkv_m1", "_o_c", "_o_m0", "_o_m1", "_up_c", "_up_m0", "_up_m1",
        "_down_c", "_down_m0", "_down_m1", "_head_c", "_head_m0", "_head_m1",
        "_n_dense", "_n_moe", "_n_layers", "_layer_fixed_s", "_layer_per_token_s", "_ar_fixed_s",
        "_expert_compute_s", "_expert_fixed_s", "_expert_act_s", "_n_experts", "_miss_prob",
        "_k_active", "_head_lat_s", "_step_fixed_s", "_step_per_token_s",
        "_prefill_pair_s", "_decode_pair_s", "_kv_read_s", "_attn_lat_s", "_gemm_lat_s",
        "_flops_per_token", "_flops_per_pair",
    )

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1, coeffs: Coefficients | None = None) -> None:
        if tp < 1 or model.n_heads % tp:
            raise ValueError(f"tp={tp} must be >= 1 and divide {model.name}'s {model.n_heads} attention heads")
        self.model, self.gpu, self.tp = model, gpu, tp
        c = self.coeffs = coeffs or Coefficients()
        d, h = model.dtype_bytes, model.hidden_size
        flops = gpu.bf16_flops_per_s * c.compute_efficiency
        hbm = gpu.hbm_bytes_per_s

        def fold(op: OpCost) -> _Gemm:
            bw = hbm * getattr(c, op.efficiency)
            return (op.flops_per_token / flops, op.fixed_bytes / bw, op.bytes_per_token / bw)

        # MLA's latent KV is replicated on every rank; GQA's KV heads split up to their count.
        self._kv_shard = 1 if model.is_mla else min(tp, model.n_kv_heads)
        ops = layer_ops(h, model.n_heads, model.n_kv_heads, model.head_dim, model.intermediate_size, tp, d)
        o_params = model.n_heads * (model.v_head_dim if model.is_mla else model.head_dim) * h
        pre_params = model.attn_params_per_layer - o_params
        # The hot path's GEMMs as plain floats, one attribute each (compiled, a tuple's floats are
        # boxed objects): attention's input and output projections, the dense MLP's up and down.
        self._qkv_c, self._qkv_m0, self._qkv_m1 = fold(gemm(h, pre_params / h / tp, d))
        self._o_c, self._o_m0, self._o_m1 = fold(gemm(o_params / h / tp, h, d))
        self._up_c, self._up_m0, self._up_m1 = fold(ops["mlp_up_proj"])
        self._down_c, self._down_m0, self._down_m1 = fold(ops["mlp_down_proj"])
        shared = model.n_shared_experts * model.moe_intermediate_size
        moe = [fold(gemm(h, model.n_experts, d))]  # router (replicated, tiny)
        if shared:
            moe += [fold(gemm(h, 2 * shared / tp, d)), fold(gemm(shared / tp, h, d))]
        self._moe_gemms = tuple(moe)
        self._n_layers, self._n_dense, self._n_moe = model.n_layers, model.n_dense_layers, model.n_moe_layers
        self._gemm_lat_s = c.gemm_latency_s

        # Routed experts as one grouped GEMM (up+gate, down) per MoE layer: compute scales with
        # the T*k routed tokens, weight reads with the expected number of distinct experts hit,
        # E * (1 - (1 - k/E)^T) for T tokens choosing k of E experts uniformly.
        expert_bw = hbm * c.memory_efficiency
        self._n_experts = float(model.n_experts)
        self._k_active = float(model.n_active_experts)
        self._miss_prob = 1.0 - model.n_active_experts / model.n_experts if model.is_moe else 1.0
        self._expert_compute_s = 2.0 * model.expert_params / tp / flops
        self._expert_fixed_s = model.expert_params * d / tp / expert_bw
        self._expert_act_s = (2 * h + 3 * model.moe_intermediate_size / tp) * d / expert_bw

        # Elementwise kernels of a layer (per token) and their latencies, plus TP all-reduces.
        elem = [op for op in ops.values() if op.kind == ELEMENTWISE] + [ops["add"]]  # 2 residual adds
        self._layer_per_token_s = sum(op.bytes_per_token / (hbm * getattr(c, op.efficiency)) for op in elem)
        self._layer_fixed_s = len(elem) * c.elementwise_latency_s
        self._ar_fixed_s = 0.0
        if tp > 1:
            ring = 2.0 * (tp - 1) / tp
            self._ar_fixed_s = 2 * c.allreduce_latency_s
            self._layer_per_token_s += 2 * ring * h * d / (gpu.intra_node_bytes_per_s * c.allreduce_efficiency)

        # Attention kernels: prefill by query-key pairs, KV reads by context tokens.
        attn_flops = gpu.bf16_flops_per_s * c.attn_compute_efficiency
        self._prefill_pair_s = model.attn_flops_per_pair_per_layer / tp / attn_flops
        decode_pair_flops = model.attn_flops_per_pair_per_layer
        if model.is_mla:  # decode runs MLA in absorbed form: scores and values over the latent
            decode_pair_flops = 2.0 * model.n_heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
        self._decode_pair_s = decode_pair_flops / tp / attn_flops
        kv_rank_bytes = model.kv_values_per_token_per_layer * d / self._kv_shard
        self._kv_read_s = kv_rank_bytes / (hbm * c.attn_memory_efficiency)
        self._attn_lat_s = c.gemm_latency_s

        # Once per step: embedding lookup, LM head on sampled positions, scheduler overhead.
        emb = embedding_op(h, d)
        self._step_per_token_s = emb.bytes_per_token / (hbm * c.embedding_efficiency)
        self._step_fixed_s = c.step_overhead_s + c.elementwise_latency_s
        self._head_c, self._head_m0, self._head_m1 = fold(gemm(h, model.vocab_size / tp, d))
        self._head_lat_s = c.gemm_latency_s + (self._ar_fixed_s / 2 if tp > 1 else 0.0)
        # step_flops runs once per simulated step: its model constants are derived properties.
        self._flops_per_token = float(model.linear_flops_per_token)
        self._flops_per_pair = float(model.attn_flops_per_pair_per_layer * model.n_layers)

    @classmethod
    def from_names(cls, model: str, gpu: str, tp: int = 1) -> PerfModel:
        """Catalog model on a catalog GPU, with the shipped fitted coefficients for that GPU, or
        those of a calibrated GPU of the same architecture, or their average as a last resort."""
        spec = get_gpu(gpu)
        shipped = shipped_coefficients()
        coeffs = shipped.get(spec.name) or shipped.get(_CALIBRATION_PROXY.get(spec.name, ""))
        if coeffs is None and shipped:
            names = [f.name for f in fields(Coefficients)]
            coeffs = Coefficients(**{f: sum(getattr(v, f) for v in shipped.values()) / len(shipped) for f in names})
        return cls(get_model(model), spec, tp, coeffs)

    # --- hot path --------------------------------------------------------------------------
    def step_time_s(self, shape: StepShape) -> float:
        """Wall time of one iteration; 0.0 for an empty batch."""
        return self._step_time_s(shape.prefill_tokens, shape.prefill_seqs, shape.prefill_attn_pairs,
                                 shape.prefill_context_tokens, shape.decode_seqs, shape.decode_context_tokens)

    def _step_time_s(self, n_prefill: int, prefill_seqs: int, prefill_attn_pairs: float, prefill_context_tokens: int,
                     n_decode: int, decode_context_tokens: int) -> float:
        """:meth:`step_time_s` of the shape with these fields (policies price prefills without building one)."""
        t = n_prefill + n_decode
        if t == 0:
            return 0.0
        layer = self._layer_s(t)
        if n_prefill:
            cc = self._prefill_pair_s * prefill_attn_pairs
            mm = self._kv_read_s * prefill_context_tokens
            layer += self._attn_lat_s + (cc if cc > mm else mm)
        if n_decode:
            ctx = decode_context_tokens
            cc = self._decode_pair_s * ctx
            mm = self._kv_read_s * ctx
            layer += self._attn_lat_s + (cc if cc > mm else mm)
        total = layer * self._n_layers
        total += self._ffn_s(t)
        n_out = prefill_seqs + n_decode
        cc = self._head_c * n_out
        mm = self._head_m0 + self._head_m1 * n_out
        return total + self._head_lat_s + (cc if cc > mm else mm) + self._step_fixed_s + self._step_per_token_s * t

    def _layer_s(self, t: int) -> float:
        """A layer's fixed, elementwise and attention-projection time for ``t`` tokens (before
        the attention kernel itself, which :meth:`_step_time_s` adds)."""
        lat = self._gemm_lat_s
        layer = self._layer_fixed_s + self._ar_fixed_s + self._layer_per_token_s * t
        layer += _gemm_s(lat, self._qkv_c, self._qkv_m0, self._qkv_m1, t)
        return layer + _gemm_s(lat, self._o_c, self._o_m0, self._o_m1, t)

    def _ffn_s(self, t: int) -> float:
        """Dense-MLP and MoE layers for ``t`` tokens (they do not depend on context)."""
        lat = self._gemm_lat_s
        ffn = 0.0
        if self._n_dense:
            mlp = _gemm_s(lat, self._up_c, self._up_m0, self._up_m1, t)
            mlp += _gemm_s(lat, self._down_c, self._down_m0, self._down_m1, t)
            ffn += mlp * self._n_dense
        if self._n_moe:
            mlp = 0.0
            for ac, m0, m1 in self._moe_gemms:
                cc = ac * t
                mm = m0 + m1 * t
                mlp += lat + (cc if cc > mm else mm)
            routed = t * self._k_active
            touched = self._n_experts * (1.0 - self._miss_prob**t)
            cc = self._expert_compute_s * routed
            mm = self._expert_fixed_s * touched + self._expert_act_s * routed
            mlp += 2 * lat + (cc if cc > mm else mm)
            ffn += mlp * self._n_moe
        return ffn

    def step_flops(self, shape: StepShape) -> float:
        """Useful model FLOPs: 2 * active params per token plus attention score/value FLOPs."""
        pairs = shape.prefill_attn_pairs + shape.decode_context_tokens
        return self._flops_per_token * (shape.prefill_tokens + shape.decode_seqs) + self._flops_per_pair * pairs

    def decode_run(self, batch: int, first_context_tokens: int, num_steps: int) -> tuple[list[float], list[float]]:
        """``(step_time_s, step_flops)`` of ``num_steps`` decode-only steps of ``batch`` sequences whose
        context grows by ``batch`` tokens a step (step ``j`` reads ``first_context_tokens + batch * j``).

        Bit-identical to calling :meth:`step_time_s` and :meth:`step_flops` on each step's shape: the
        batch-dependent terms are folded once and the per-step terms are added in the same order.
        """
        if batch < 1 or num_steps < 1:
            raise ValueError(f"batch and num_steps must be >= 1, got {batch} and {num_steps}")
        t = batch
        layer = self._layer_s(t)
        cc = self._head_c * t
        mm = self._head_m0 + self._head_m1 * t
        head = cc if cc > mm else mm
        ffn, n_layers, attn_lat_s = self._ffn_s(t), self._n_layers, self._attn_lat_s
        pair_s, kv_s, head_lat_s, step_fixed_s = self._decode_pair_s, self._kv_read_s, self._head_lat_s, self._step_fixed_s
        per_token_s = self._step_per_token_s * t
        flops_t, per_pair = self._flops_per_token * t, self._flops_per_pair
        times: list[float] = []
        flops: list[float] = []
        # A plain loop: runs are a few steps long, where numpy's per-call cost dominates (and the
        # loop is compiled: tokenomy._native). Same operations, same order, as step_time_s.
        for j in range(num_steps):
            ctx = float(first_context_tokens + batch * j)
            a, b = pair_s * ctx, kv_s * ctx
            total = (layer + (attn_lat_s + (a if a >= b else b))) * n_layers + ffn
            times.append((((total + head_lat_s) + head) + step_fixed_s) + per_token_s)
            flops.append(flops_t + per_pair * ctx)
        return times, flops

    @property
    def peak_flops_per_s(self) -> float:
        return self.tp * self.gpu.bf16_flops_per_s

    # --- convenience -----------------------------------------------------------------------
    def prefill_time_s(self, n_new_tokens: int, n_cached_tokens: int = 0) -> float:
        """One step computing a whole prompt of ``n_new_tokens`` after ``n_cached_tokens`` of prefix."""
        if not n_new_tokens:
            return self._step_time_s(0, 0, StepShape.chunk_attn_pairs(0, n_cached_tokens), 0, 0, 0)
        return self.chunk_step_time_s(n_new_tokens, n_cached_tokens, 0, 0)

    def chunk_step_time_s(self, n_new_tokens: int, n_context_tokens: int, decode_seqs: int,
                          decode_context_tokens: int) -> float:
        """One step of one prefill chunk of ``n_new_tokens`` after ``n_context_tokens`` beside
        ``decode_seqs`` decodes of ``decode_context_tokens`` tokens of context: :meth:`step_time_s` of
        that shape, without building it (AMPD prices a dozen such steps per local-chunk decision)."""
        pairs = n_new_tokens * (n_context_tokens + (n_new_tokens + 1) / 2.0)  # StepShape.chunk_attn_pairs, inline
        return self._step_time_s(n_new_tokens, 1, pairs, n_context_tokens + n_new_tokens, decode_seqs,
                                 decode_context_tokens)

    def decode_step_time_s(self, batch_size: int, mean_context_tokens: float) -> float:
        """One decode step of ``batch_size`` sequences with this mean context length."""
        return self.step_time_s(StepShape(
            decode_seqs=batch_size, decode_context_tokens=round(batch_size * mean_context_tokens)))

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token occupies on all ``tp`` ranks together (replicas counted)."""
        return self.model.kv_bytes_per_token * self.tp // self._kv_shard

    def kv_transfer_time_s(self, n_tokens: int, link_bytes_per_s: float | None = None) -> float:
        """Time to ship ``n_tokens`` of KV to another instance: every rank sends its own shard
        over its own link (default: the GPU's inter-node NIC), after a fixed setup latency."""
        link = self.gpu.inter_node_bytes_per_s if link_bytes_per_s is None else link_bytes_per_s
        if link <= 0:
            raise ValueError(f"link_bytes_per_s must be > 0, got {link}")
        if n_tokens <= 0:
            return 0.0
        return self.coeffs.kv_transfer_setup_s + n_tokens * self.kv_bytes_per_token / self.tp / link

    def kv_capacity_tokens(
        self, gpu_memory_utilization: float = 0.9, activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES
    ) -> int:
        """Tokens of KV cache that fit beside the weights on the ``tp`` GPUs.

        Raises ``ValueError`` if the utilisation is outside (0, 1] or the weights do not fit.
        """
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        usable = self.tp * (self.gpu.memory_bytes * gpu_memory_utilization - activation_reserve_bytes)
        free = usable - self.model.weight_bytes
        if free <= 0:
            need = math.ceil(self.model.weight_bytes / (self.gpu.memory_bytes * gpu_memory_utilization
                                                         - activation_reserve_bytes))
            raise ValueError(
                f"{self.model.name} weights ({self.model.weight_bytes / 1e9:.1f} GB) do not fit on {self.tp} x "
                f"{self.gpu.name} at {gpu_memory_utilization:.0%} memory ({max(usable, 0) / 1e9:.1f} GB usable); "
                f"need tp >= {need}")
        return int(free // self.kv_bytes_per_token)

    def num_kv_blocks(self, block_size_tokens: int, gpu_memory_utilization: float = 0.9) -> int:
        """KV blocks of ``block_size_tokens`` that fit (see ``kv_capacity_tokens``)."""
        if block_size_tokens <= 0:
            raise ValueError(f"block_size_tokens must be > 0, got {block_size_tokens}")
        return self.kv_capacity_tokens(gpu_memory_utilization) // block_size_tokens
