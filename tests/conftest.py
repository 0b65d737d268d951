"""Fixtures shared by every test folder."""

from __future__ import annotations

from typing import Any

import pytest

from tokenomy.policy.ampd import AMPD_POLICIES


@pytest.fixture
def spied_registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Wrap every ``AMPD_POLICIES`` entry so that a test sees which policy objects it built
    (name -> objects, in the order they were built)."""
    built: dict[str, list[Any]] = {name: [] for name in AMPD_POLICIES.names()}
    for name in AMPD_POLICIES.names():
        factory = AMPD_POLICIES.get(name)

        def spy(cfg: Any, deps: Any, _f: Any = factory, _n: str = name) -> Any:
            obj = _f(cfg, deps)
            built[_n].append(obj)
            return obj

        monkeypatch.setitem(AMPD_POLICIES._items, name, spy)
    return built
