"""Fixtures: an in-process emulator app (fast modelled clock) and helpers."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from tokenomy.emulator import EmulatorConfig, build_app

FAST = 0.001
"""Wall seconds per modelled second in unit tests: the model's timeline, a thousand times faster."""


@pytest.fixture
def client() -> Iterator[TestClient]:
    # KV held for a decode instance is kept a (modelled) day: tests release it themselves.
    config = EmulatorConfig(time_scale=FAST, instance_id="unit-0", port=9, kv_release_timeout_s=86400.0)
    with TestClient(build_app(config)) as c:
        yield c


def metric(text: str, name: str) -> float:
    """The value of the first sample called ``name`` in Prometheus text."""
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))
