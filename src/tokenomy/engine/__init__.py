"""The engine model: one inference instance scheduled the way vLLM v1 does it.

Continuous batching with a per-step token budget and chunked prefill, paged KV blocks with
chained-key prefix caching and LRU eviction, preemption by recompute, KV retention across tool
calls. Clock-agnostic: driven by the simulator (virtual clock) and the emulator (wall clock).
"""

from tokenomy.engine.block_keys import KeyChainCache
from tokenomy.engine.config import EngineConfig
from tokenomy.engine.engine import Engine
from tokenomy.engine.results import EngineStats, FinishedRequest, StepResult
from tokenomy.engine.trace import EventTrace, JsonlTrace, ListTrace, NoTrace

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineStats",
    "EventTrace",
    "FinishedRequest",
    "JsonlTrace",
    "KeyChainCache",
    "ListTrace",
    "NoTrace",
    "StepResult",
]
