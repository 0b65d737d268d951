"""Fixtures shared by the perf tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def fidelity() -> ModuleType:
    """``benchmarks/_fidelity.py``, loaded from its file (it imports nothing else from benchmarks/)."""
    spec = importlib.util.spec_from_file_location("_fidelity", BENCHMARKS / "_fidelity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
