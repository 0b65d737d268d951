"""Token classes and cost of one request: the metering rules of docs/gateway.md.

A request's prompt is split two ways:

* by **novelty** within its session: ``input_tokens`` (turn 0: the whole prompt, new to the
  session), ``incremental_prefill_tokens`` (turn k > 0: prompt tokens beyond the previous turn's
  prompt + answer) and ``history_tokens`` (the re-sent previous prompt + answer);
  ``input + incremental + history == prompt_tokens`` always.
* by **cache**: ``cached_tokens`` (the backend's cache reads: chat's
  ``prompt_tokens_details.cached_tokens``, Messages' ``cache_read_input_tokens``, Responses'
  ``input_tokens_details.cached_tokens``) and ``recomputed_tokens = prompt_tokens - cached_tokens``
  (Messages' cache writes are computed, so they count here).

Output has one part of its own: ``reasoning_tokens``, the output spent on chain-of-thought where the
backend reports it (chat's ``completion_tokens_details.reasoning_tokens``, Responses'
``output_tokens_details.reasoning_tokens``); ``reasoning_tokens <= output_tokens``.

Cost: recomputed prompt tokens at the input price, cached ones at the cached-input price, output
at the output price (reasoning at ``reasoning_per_mtok`` when the price names one);
``cache_savings_usd`` is what the cached tokens would have cost recomputed.

A session is keyed by (charged key, session id) so two tenants' equal session ids never mix.
Turns are numbered in the order their usage arrives; a request without a session id is a
one-turn session of its own. A prompt shorter than the previous prompt + answer (the client
edited its history) counts as history up to its own length, with no incremental prefill.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tokenomy.gateway.config import Price


@dataclass(frozen=True, slots=True)
class SessionState:
    """What the next turn of a session is measured against."""

    turn: int  # the last metered turn
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class TokenClasses:
    turn: int
    prompt_tokens: int
    input_tokens: int
    incremental_prefill_tokens: int
    history_tokens: int
    output_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    reasoning_tokens: int = 0  # a part of output_tokens


@dataclass(frozen=True, slots=True)
class Cost:
    recomputed_usd: float
    cached_usd: float
    output_usd: float
    cache_savings_usd: float

    @property
    def total_usd(self) -> float:
        return self.recomputed_usd + self.cached_usd + self.output_usd


def classify(
    prev: SessionState | None, prompt_tokens: int, output_tokens: int, cached_tokens: int, reasoning_tokens: int = 0
) -> TokenClasses:
    """The classes of a request whose session's last metered turn is ``prev`` (None: first turn)."""
    prompt = max(0, prompt_tokens)
    cached = min(max(0, cached_tokens), prompt)
    if prev is None:
        turn, history = 0, 0
    else:
        turn = prev.turn + 1
        history = min(prompt, prev.prompt_tokens + prev.output_tokens)
    new = prompt - history
    return TokenClasses(
        turn=turn,
        prompt_tokens=prompt,
        input_tokens=new if turn == 0 else 0,
        incremental_prefill_tokens=new if turn > 0 else 0,
        history_tokens=history,
        output_tokens=max(0, output_tokens),
        cached_tokens=cached,
        recomputed_tokens=prompt - cached,
        reasoning_tokens=min(max(0, reasoning_tokens), max(0, output_tokens)),
    )


def cost(classes: TokenClasses, price: Price) -> Cost:
    per = 1e-6
    return Cost(
        recomputed_usd=classes.recomputed_tokens * price.input_per_mtok * per,
        cached_usd=classes.cached_tokens * price.cached_input_per_mtok * per,
        output_usd=_output_usd(classes, price) * per,
        cache_savings_usd=classes.cached_tokens * (price.input_per_mtok - price.cached_input_per_mtok) * per,
    )


def _output_usd(classes: TokenClasses, price: Price) -> float:
    """Output at the output price, its reasoning part at the reasoning price when one is set (USD x 1e6)."""
    r = classes.reasoning_tokens
    if price.reasoning_per_mtok is None or not r:
        return classes.output_tokens * price.output_per_mtok
    return (classes.output_tokens - r) * price.output_per_mtok + r * price.reasoning_per_mtok


def worst_case_cost_usd(prompt_tokens: int, max_tokens: int, price: Price) -> float:
    """Upper bound on a request's cost: no cache hit, every allowed output token produced."""
    return (prompt_tokens * price.input_per_mtok + max_tokens * price.output_per_mtok) * 1e-6


class SessionTracker:
    """The last metered turn of recent sessions, least recently used forgotten first.

    A forgotten or never-seen session is looked up in the ledger by the caller (after a
    restart the ledger is the truth); this is only a cache in front of it.
    """

    def __init__(self, max_sessions: int = 100_000) -> None:
        self.max_sessions = max_sessions
        self._states: OrderedDict[tuple[str, str], SessionState] = OrderedDict()

    def get(self, key: tuple[str, str]) -> SessionState | None:
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
        return state

    def knows(self, key: tuple[str, str]) -> bool:
        return key in self._states

    def put(self, key: tuple[str, str], state: SessionState) -> None:
        self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > self.max_sessions:
            self._states.popitem(last=False)


def estimate_tokens(text_chars: int) -> int:
    """A prompt-size estimate before the backend counts: ~4 characters a token, at least 1."""
    return max(1, text_chars // 4)


def prefill_cached_tokens(kv_transfer_params: Any) -> int | None:
    """Under P/D, the prompt tokens the prefill backend did not compute, from the
    ``kv_transfer_params`` it answered (``remote_prefill_cached_tokens``: vLLM's NixlConnector and
    our emulator send it); None when the request was not prefilled remotely or the engine did not say.

    Metering takes a remotely prefilled request's cached/recomputed split from here rather than
    from the decode backend's ``cached_tokens``: what a decode side reports for KV it received
    depends on the connector (NIXL reports this same number; a connector that loads KV from disk
    reports the loaded tokens as cached), while the prefill side's count is what was computed.
    """
    if not isinstance(kv_transfer_params, dict):
        return None
    n = kv_transfer_params.get("remote_prefill_cached_tokens")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None
