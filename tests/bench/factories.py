"""Small hand-built workloads and a bench config factory for the bench's tests."""

from __future__ import annotations

from typing import Any

from tokenomy.bench import BenchConfig
from tokenomy.core import Session
from tokenomy.workload import StreamKeys
from tokenomy.workload.build import grow_turns


def agent_sessions(n: int, *, turns: int = 3, sys_tokens: int = 40, new: int = 20, out: int = 8,
                   think_s: float = 2.0, gap_s: float = 1.0) -> list[Session]:
    """``n`` agent sessions sharing one system prompt, starting ``gap_s`` apart."""
    keys = StreamKeys()
    sys_key = keys.new()
    return [
        Session(f"s{i}", i * gap_s, grow_turns(sys_key, sys_tokens, keys.new(), [new + i] * turns,
                                              [out] * turns, [think_s] * turns))
        for i in range(n)
    ]


def config(**overrides: Any) -> BenchConfig:
    kwargs: dict[str, Any] = {"targets": ("http://fake",), "model": "fake-model"}
    kwargs.update(overrides)
    return BenchConfig(**kwargs)
