"""``previous_response_id`` at the gateway: a Responses chain continues on any backend, any replica.

The gateway keeps the chain itself rather than pinning it to the backend that stored it: a chain
pinned to one vLLM instance dies with it (and vLLM keeps stored responses in that process's memory
only), while agents' chains outlive instances. So:

* a request with ``store`` (the Responses default) has its whole input kept with its answer's output
  items, in the ledger's database, under the answer's id (:mod:`tokenomy.gateway.stores.answers_sql`),
  before the client sees completion;
* a request with ``previous_response_id`` gets that answer's input and output put in front of its
  own ``input`` (``instructions`` are not carried over, as the Responses API says) and goes to the
  backend as a self-contained request;
* the backend always gets ``store: false`` and no ``previous_response_id``: it keeps no state.

A chain may be continued only by keys of the tenant (org) that stored it; an unknown, expired or
foreign id is a 400 ``previous_response_not_found``.
"""

from __future__ import annotations

from typing import Any

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.parse import ParsedRequest
from tokenomy.gateway.http.responses_adapter import RESPONSES, input_items
from tokenomy.gateway.metering.meter import estimate_tokens
from tokenomy.gateway.stores.answers_sql import AnswerRows, MemoryAnswers

# Labelled default: how long a stored answer can be continued (OpenAI keeps stored responses 30 days).
ANSWER_TTL_S = 30 * 86_400.0


class ResponseChain:
    def __init__(self, rows: AnswerRows | None) -> None:
        self.rows: AnswerRows = rows if rows is not None else MemoryAnswers(ANSWER_TTL_S)

    async def expand(self, req: ParsedRequest, tenant: tuple[str, ...]) -> None:
        """Put the previous answer's input and output in front of ``req``'s input; note what to store."""
        body = req.body
        prev = body.pop("previous_response_id", None)
        items = input_items(body)
        if prev is not None:
            stored = await self.rows.load(str(prev))
            if stored is None or (tenant and stored.owner != tenant[0]):
                raise GatewayError(400, f"previous response {prev!r} was not found (unknown, expired, or stored "
                                   "by another tenant)", "invalid_request_error", "previous_response_not_found",
                                   "previous_response_id")
            items = [*stored.input, *(_as_input(o) for o in stored.output), *items]
            body["input"] = items
            req.prompt_tokens_estimate = estimate_tokens(RESPONSES.shape(body).chars)
        store = body.get("store", True) is not False
        body["store"] = False
        req.stored_input = items if store else None
        req.tenant = tenant

    async def save(self, req: ParsedRequest, answer: dict[str, Any]) -> None:
        rid = answer.get("id")
        output = answer.get("output")
        if req.stored_input is None or not isinstance(rid, str) or not isinstance(output, list):
            return
        await self.rows.save(rid, req.tenant[0] if req.tenant else "", req.stored_input, output)


def _as_input(item: Any) -> Any:
    """An output item as the next request's input item (status is output-only)."""
    if isinstance(item, dict):
        return {k: v for k, v in item.items() if k != "status"}
    return item
