"""The TPOT slack an instance's streams have banked (AMPD's ``tpot_bank``, docs/ampd.md).

vLLM's TPOT is a per-request mean, ``(E2E - TTFT) / (output_tokens - 1)``. A stream ``k`` tokens
past its first, ``e`` seconds after it, may stall ``k * tpot_s - e`` more and still end within its
TPOT SLO whenever it ends (the bank). With ``expected_tokens`` (a low quantile of the
output lengths seen so far, never the stream's own length) a stream that has emitted ``k + 1``
tokens is also expected to emit ``r = expected_tokens - k - 1`` more at ``itl_s`` each, and each of
those steps leaves ``tpot_s - itl_s`` of its SLO unspent: it may stall
``(k + r) * tpot_s - e - r * itl_s`` (the forward-looking bank). Normal steps keep
that quantity constant; stalls spend it; a stream past ``expected_tokens`` has only its own bank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from tokenomy.engine.request_state import RequestState


def tpot_bank_s(streams: Iterable[RequestState], at: float, ran: int, tpot_s: float,
                expected_tokens: int = 0, itl_s: float = 0.0) -> float:
    """Least bank over ``streams`` (those with a first token) at ``at``; ``ran``: tokens each emitted
    in a decode run not yet applied; inf when none streams (module docstring)."""
    ahead = max(0.0, tpot_s - itl_s)
    best = math.inf
    for r in streams:
        if r.first_token_s is None:
            continue
        k = r.num_tokens - r.prompt_tokens - 1 + ran
        best = min(best, tpot_s * k - (at - r.first_token_s) + max(0, expected_tokens - 1 - k) * ahead)
    return best
