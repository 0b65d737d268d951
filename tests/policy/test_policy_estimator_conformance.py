"""The perf team's PerfModel must satisfy the policy Estimator protocol (skipped until it exists)."""

from __future__ import annotations

import inspect

import pytest

import tokenomy.perf

REQUIRED_METHODS = {
    "prefill_time_s": ["n_new_tokens", "n_cached_tokens"],
    "decode_step_time_s": ["batch_size", "mean_context_tokens"],
    "step_time_s": ["shape"],
    "chunk_step_time_s": ["n_new_tokens", "n_context_tokens", "decode_seqs", "decode_context_tokens"],
    "kv_transfer_time_s": ["n_tokens", "link_bytes_per_s"],
}


def test_perf_model_provides_every_estimator_member() -> None:
    perf_model = getattr(tokenomy.perf, "PerfModel", None)
    if perf_model is None:
        pytest.skip("tokenomy.perf.PerfModel does not exist yet")
    for name, params in REQUIRED_METHODS.items():
        method = getattr(perf_model, name, None)
        assert callable(method), f"PerfModel lacks {name}()"
        # policies pass these positionally, so the count matters, not the names
        assert len(inspect.signature(method).parameters) - 1 >= len(params), f"{name} takes {params}"
    assert hasattr(perf_model, "kv_bytes_per_token"), "PerfModel lacks kv_bytes_per_token"
