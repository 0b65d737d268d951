"""One AMPD turn as the simulated deployment tracks it: where it is bound, prefilled and decoded."""

from __future__ import annotations

from dataclasses import dataclass

from tokenomy.core import Request, RequestRecord
from tokenomy.engine import FinishedRequest
from tokenomy.policy.ampd import PlacementDecision
from tokenomy.sim.base import incomplete_record


@dataclass(slots=True)
class Turn:
    request: Request
    decode_id: str
    local: bool
    prefill_id: str = ""
    prefill: FinishedRequest | None = None
    kv_arrived_s: float | None = None
    placement: PlacementDecision | None = None  # why it runs where it runs (None: placement off)


def unfinished_record(turn: Turn) -> RequestRecord:
    """A turn whose KV transfer was cut by its timeout: incomplete, counted, its work kept."""
    if turn.prefill is None:  # cut before its prefill ran (a history pull): nothing computed
        return RequestRecord(
            request_id=turn.request.request_id, arrival_s=turn.request.arrival_s, first_token_s=None,
            finish_s=None, prompt_tokens=turn.request.prompt_tokens, output_tokens=0,
            session_id=turn.request.session_id, turn=turn.request.turn, tenant=turn.request.tenant,
            finished=False, prefill_instance=turn.prefill_id, decode_instance=turn.decode_id,
        )
    return incomplete_record(turn.request, turn.prefill, turn.prefill_id)
