"""Shared helpers for workload tests."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces"
MOONCAKE_CONV = SHARED_TRACES / "mooncake" / "conversation_trace.jsonl"
AZURE_CONV = SHARED_TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def require(path: Path) -> Path:
    """Skip the test when the shared data (not part of a clone) is absent."""
    if not path.is_file():
        pytest.skip(f"shared trace {path} not present (lives in ../shared/data next to the repo)")
    return path
