"""One AMPD turn as the simulated deployment tracks it: where it is bound, prefilled and decoded."""

from __future__ import annotations

from dataclasses import dataclass

from tokenomy.core import Request
from tokenomy.engine import FinishedRequest
from tokenomy.policy.ampd import PlacementDecision


@dataclass(slots=True)
class Turn:
    request: Request
    decode_id: str
    local: bool
    prefill_id: str = ""
    prefill: FinishedRequest | None = None
    kv_arrived_s: float | None = None
    placement: PlacementDecision | None = None  # why it runs where it runs (None: placement off)
    lent: bool = False  # decoded by its prefill instance (SlackAdmission.lend)
    lender: str = ""  # the prefill instance decoding it until it moves back (SlackAdmission.borrow)
    lent_blocks: int = 0  # the blocks it holds there
    lent_part: FinishedRequest | None = None  # what it did there before it moved back
