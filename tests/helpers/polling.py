"""The one polling loop of the tests: wait for a stated condition, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(pred: Callable[[], Any], timeout_s: float = 5.0, interval_s: float = 0.02,
             what: str = "the condition") -> Any:
    """``pred()``'s first truthy value, polled every ``interval_s``; AssertionError after ``timeout_s``
    (``pred`` may raise to give up sooner)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"waited {timeout_s:g} s for {what}")
