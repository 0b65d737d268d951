"""Synthetic single-turn chat: one request per session behind a shared system prompt.

Default lengths follow the Azure LLM inference trace 2023, conversation split (19,366
requests): prompt mean 1,155 tokens with CV 0.96, output mean 211 with CV 0.77. The
128-token shared system prompt is our assumption (the trace has no content). See
docs/workloads.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenomy.core import Session
from tokenomy.workload.build import grow_turns
from tokenomy.workload.dists import LogNormal
from tokenomy.workload.keys import StreamKeys


@dataclass(frozen=True, slots=True)
class ChatProfile:
    """Lengths of a single-turn chat request.

    ``system_prompt_tokens`` is shared by every session (one stream); ``user_tokens`` and
    ``output_tokens`` are drawn per session.
    """

    system_prompt_tokens: int = 128
    user_tokens: LogNormal = LogNormal(mean=1030.0, cv=1.0, low=1, high=16_000)
    output_tokens: LogNormal = LogNormal(mean=211.0, cv=0.8, low=1, high=4096)

    def __post_init__(self) -> None:
        if self.system_prompt_tokens < 0:
            raise ValueError(f"system_prompt_tokens must be >= 0, got {self.system_prompt_tokens}")
        if self.user_tokens.low < 1 or self.output_tokens.low < 1:
            raise ValueError("user_tokens and output_tokens need low >= 1")


CHAT = ChatProfile()


def chat_sessions(
    start_times_s: np.ndarray,
    rng: np.random.Generator,
    profile: ChatProfile = CHAT,
    keys: StreamKeys | None = None,
    id_prefix: str = "chat",
) -> list[Session]:
    """One single-turn session per start time, ids ``f"{id_prefix}-{i}"``, in input order."""
    keys = keys or StreamKeys()
    sys_key = keys.new()
    n = len(start_times_s)
    users = profile.user_tokens.sample_int(rng, n)
    outs = profile.output_tokens.sample_int(rng, n)
    return [
        Session(
            session_id=f"{id_prefix}-{i}",
            start_s=float(start_times_s[i]),
            turns=grow_turns(sys_key, profile.system_prompt_tokens, keys.new(), [users[i]], [outs[i]], [0.0]),
        )
        for i in range(n)
    ]
