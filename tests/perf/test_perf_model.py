"""PerfModel: step times behave like the hardware a user knows, and sizes add up."""

from __future__ import annotations

import inspect

import pytest

from tokenomy.core import StepShape, StepTimeModel
from tokenomy.perf import Coefficients, PerfModel, get_gpu, get_model


def _perf(model: str = "Llama-3.1-8B", gpu: str = "h100", tp: int = 1) -> PerfModel:
    return PerfModel.from_names(model, gpu, tp)


def _decode(batch: int, ctx: int) -> StepShape:
    return StepShape(decode_seqs=batch, decode_context_tokens=batch * ctx)


def test_satisfies_the_core_protocol_and_the_policy_estimator() -> None:
    pm: StepTimeModel = _perf()
    assert pm.step_flops(_decode(1, 10)) > 0
    for name in ("prefill_time_s", "decode_step_time_s", "step_time_s", "kv_transfer_time_s"):
        assert callable(getattr(pm, name))
    assert "n_cached_tokens" in inspect.signature(pm.prefill_time_s).parameters
    assert isinstance(pm.kv_bytes_per_token, int)


@pytest.mark.parametrize("n, context, seqs, decode_ctx", [(1, 0, 0, 0), (512, 3000, 7, 9000), (8192, 120_000, 64, 2_000_000)])
def test_a_chunk_step_is_priced_as_its_shape(n: int, context: int, seqs: int, decode_ctx: int) -> None:
    """``chunk_step_time_s`` (what AMPD's local chunk prices with) is ``step_time_s`` of the same shape, exactly."""
    pm = _perf()
    shape = StepShape(prefill_tokens=n, prefill_seqs=1, prefill_attn_pairs=StepShape.chunk_attn_pairs(n, context),
                      prefill_context_tokens=context + n, decode_seqs=seqs, decode_context_tokens=decode_ctx)
    assert pm.chunk_step_time_s(n, context, seqs, decode_ctx) == pm.step_time_s(shape) > 0


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Qwen3-30B-A3B", "DeepSeek-V3"])
def test_empty_step_costs_nothing(model: str) -> None:
    assert _perf(model, tp=8 if model == "DeepSeek-V3" else 1).step_time_s(StepShape()) == 0.0


@pytest.mark.parametrize(("model", "gpu", "tp"),
                         [("Llama-3.1-8B", "h100", 1), ("Llama-3.1-70B", "a100", 4), ("Qwen3-30B-A3B", "h20", 1),
                          ("DeepSeek-V3", "h200", 16), ("Qwen3-32B", "l40s", 2)])
def test_more_tokens_take_more_time(model: str, gpu: str, tp: int) -> None:
    pm = _perf(model, gpu, tp)
    prefill = [pm.prefill_time_s(n) for n in (1, 128, 1024, 8192, 32768)]
    decode = [pm.decode_step_time_s(b, 2048) for b in (1, 8, 64, 256)]
    longer_context = [pm.decode_step_time_s(32, c) for c in (128, 4096, 65536)]
    cached = [pm.prefill_time_s(1024, c) for c in (0, 8192, 65536)]
    for series in (prefill, decode, longer_context, cached):
        assert all(a < b for a, b in zip(series, series[1:], strict=False)), series


def test_decode_is_memory_bound_at_small_batch() -> None:
    pm = _perf()
    # Reading the weights dominates: 8x the sequences costs barely more than one.
    assert pm.decode_step_time_s(8, 1024) < 1.1 * pm.decode_step_time_s(1, 1024)
    # The floor is the weight read at HBM speed.
    assert pm.decode_step_time_s(1, 1024) > pm.model.weight_bytes / pm.gpu.hbm_bytes_per_s


def test_prefill_is_compute_bound_at_large_chunks() -> None:
    pm = _perf()
    t4k, t8k = pm.prefill_time_s(4096), pm.prefill_time_s(8192)
    assert 1.8 < t8k / t4k < 2.4  # linear work plus growing attention
    shape = StepShape(prefill_tokens=8192, prefill_seqs=1, prefill_attn_pairs=StepShape.chunk_attn_pairs(8192, 0),
                      prefill_context_tokens=8192)
    mfu = pm.step_flops(shape) / (pm.step_time_s(shape) * pm.peak_flops_per_s)
    assert 0.4 < mfu < 0.8


def test_uncalibrated_roofline_reaches_peak_on_big_prefill() -> None:
    ideal = Coefficients(step_overhead_s=0.0, attn_compute_efficiency=1.0, attn_memory_efficiency=1.0)
    pm = PerfModel(get_model("Llama-3.1-8B"), get_gpu("h100"), 1, ideal)
    shape = StepShape(prefill_tokens=16384, prefill_seqs=1,
                      prefill_attn_pairs=StepShape.chunk_attn_pairs(16384, 0), prefill_context_tokens=16384)
    assert pm.step_flops(shape) / pm.peak_flops_per_s == pytest.approx(pm.step_time_s(shape), rel=0.1)


@pytest.mark.parametrize(("model", "gpu"), [("Llama-3.1-8B", "h100"), ("Llama-3.1-70B", "h100"),
                                             ("Qwen3-32B", "a100")])
def test_tensor_parallel_cuts_big_prefill_time(model: str, gpu: str) -> None:
    times = [_perf(model, gpu, tp).prefill_time_s(8192) for tp in (1, 2, 4, 8)]
    assert times[1] < 0.7 * times[0]
    # Diminishing returns (all-reduce, fixed step overhead), but never slower.
    assert all(b < a for a, b in zip(times, times[1:], strict=False)), times


def test_tp_must_divide_heads() -> None:
    with pytest.raises(ValueError, match="divide"):
        _perf("Llama-3.1-8B", tp=3)


def test_moe_reads_only_touched_experts() -> None:
    pm = _perf("Qwen3-30B-A3B", "h100")
    dense_like = _perf("Qwen3-32B", "h100")
    # One token touches 8 of 128 experts: decode is far cheaper than a dense model of the same size.
    assert pm.decode_step_time_s(1, 1024) < 0.5 * dense_like.decode_step_time_s(1, 1024)
    # A big batch touches (nearly) all experts, so per-token cost falls steeply with batch size.
    assert pm.decode_step_time_s(256, 1024) / 256 < pm.decode_step_time_s(1, 1024) / 10


def test_kv_capacity_is_sensible() -> None:
    pm = _perf()
    tokens = pm.kv_capacity_tokens()
    # (80 GiB * 0.9 - 2 GiB reserve - 16 GB weights) / 128 KiB per token
    assert 400_000 < tokens < 500_000
    assert pm.kv_capacity_tokens(0.5) < tokens
    assert pm.num_kv_blocks(16) == tokens // 16
    assert _perf("Llama-3.1-70B", tp=8).kv_capacity_tokens() > _perf("Llama-3.1-70B", tp=4).kv_capacity_tokens()


def test_kv_capacity_explains_when_weights_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"do not fit on 1 x H100-SXM.*need tp >= 2"):
        _perf("Llama-3.1-70B").kv_capacity_tokens()
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        _perf().kv_capacity_tokens(1.5)


def test_kv_bytes_count_replicas_under_tp() -> None:
    assert _perf("Llama-3.1-8B", tp=8).kv_bytes_per_token == 131072  # 8 KV heads split over 8 ranks
    assert _perf("Qwen3-30B-A3B", tp=8).kv_bytes_per_token == 2 * 98304  # 4 KV heads, each on 2 ranks
    assert _perf("DeepSeek-V3", "h200", tp=8).kv_bytes_per_token == 8 * 70272  # MLA latent on every rank


def test_kv_transfer_time_scales_with_tokens_and_link() -> None:
    pm = _perf()
    assert pm.kv_transfer_time_s(0) == 0.0
    t8k = pm.kv_transfer_time_s(8192)
    # 8192 * 128 KiB = 1.07 GB over a 50 GB/s NIC, plus setup
    assert t8k == pytest.approx(8192 * 131072 / 50e9 + pm.coeffs.kv_transfer_setup_s)
    assert pm.kv_transfer_time_s(8192, link_bytes_per_s=450e9) < t8k / 5
    with pytest.raises(ValueError, match="link_bytes_per_s"):
        pm.kv_transfer_time_s(10, link_bytes_per_s=0)


def test_from_names_uses_shipped_fitted_coefficients() -> None:
    fitted = _perf().coeffs
    assert fitted.compute_efficiency < 1.0 and fitted.gemm_latency_s > 0
    assert _perf(gpu="h200").coeffs == fitted  # same architecture borrows H100's fit
    assert _perf(gpu="l40s").coeffs.compute_efficiency < 1.0


