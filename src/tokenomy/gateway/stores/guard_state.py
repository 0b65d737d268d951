"""The state token operations keep per request: one interface, an in-process and a Redis implementation.

``OpsGuard`` (``ops/ops_guard.py``) is the policy: who a key is, what a request may cost, what a
refusal says, which alerts fire. Everything it counts lives behind ``GuardState``: breaker state
per key and session, RPM/TPM buckets and concurrency slots on every node of a key's path, budget
holds and spend on every (node, period). Each method that changes state is one atomic step inside
its store, never a sequence the caller must keep uninterrupted:

* ``admit``: every check first — a request id that holds already (409 ``duplicate_request_id``),
  the key's and session's breakers (429 ``breaker_*``), every bucket and concurrency slot on the
  path (429 ``rate_limit_*``, ``concurrency_limit``, ``*_over_limit``), the hold against every
  budgeted charge (a ``Refusal``, which the policy turns into its 429) — and only when all pass,
  every charge: the breaker's turn, the buckets, a slot on every node, the hold. A refused request
  changes nothing but the trip a breaker records.
* ``finish``: settle (``actual_usd``) or release (None) the hold, correct the TPM estimate to the
  actual tokens, return the slots, move the session's worst case to its actual cost. Idempotent
  per request id: a second call finds no hold and changes nothing.
* ``stream_tokens``: streamed output tokens in the velocity windows; False once a cap is crossed.

The steps and results are plain slots dataclasses, not frozen ones (whose constructor costs
microseconds on the request path); nothing changes one once the store has it.

Implementations: ``local_state.LocalState`` (one process; budgets in memory or SQLite) and
``redis_state.RedisState`` (a fleet; each step one Lua script). Both pass the same contract tests
(``tests/gateway/stores/test_guard_state.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tokenomy.gateway.ops.breaker import Trip
from tokenomy.gateway.ops.tenancy import NodeLimits
from tokenomy.gateway.stores.reservations import Charge, Hold, Refusal


class StoreUnavailable(Exception):
    """The store did not answer (down, or slower than its timeout): the step may or may not have
    happened. The policy decides what to serve meanwhile (``ops.shared.on_outage``)."""


@dataclass(slots=True)
class AdmitStep:
    """One request's admission, as the store checks and charges it."""

    request_id: str
    key_id: str
    session_id: str | None
    fingerprint: str | None  # the prompt's tail / tool call, for the repetition breaker
    prompt_tokens: int  # counted in the velocity windows at admission
    path: tuple[tuple[str, NodeLimits], ...]  # (node id, limits) of the key's path, root first
    tokens: int  # the TPM estimate charged now (prompt estimate + max_tokens)
    hold: Hold  # the worst-case cost, held on every charge
    budgets_usd: Mapping[Charge, float]  # charges without an entry are counted, never refused
    now_s: float
    session_need_usd: float = 0.0  # a session with less budget left than this trips its breaker


@dataclass(slots=True)
class Admitted:
    headers: dict[str, str]  # OpenAI's x-ratelimit-* for the tightest bucket of each kind
    spent_usd: tuple[float, ...]  # each charge's settled spend as the hold was taken (budget tiers)


@dataclass(slots=True)
class FinishStep:
    """The end of an admitted request: settled at ``actual_usd``, or released (None)."""

    request_id: str
    key_id: str
    session_id: str | None
    node_ids: tuple[str, ...]  # the path the request holds slots and TPM on
    charges: tuple[Charge, ...]  # its hold's charges, as admitted
    estimate_tokens: int  # the TPM estimate admission charged
    worst_usd: float
    actual_usd: float | None
    actual_tokens: int
    now_s: float
    undo_turn: bool = False  # refused after admission (shed from the queue): no turn counted


@dataclass(slots=True)
class Finished:
    hold: Hold | None  # the hold this call finished; None when nothing was held (a second call)
    spent_usd: Mapping[Charge, float] = field(default_factory=dict)  # each charge's spend right after


@dataclass(frozen=True, slots=True)
class Upkeep:
    """What a heartbeat did: holds of dead owners reclaimed; settles retried (with their cost)."""

    reclaimed: Mapping[str, int] = field(default_factory=lambda: {"settled": 0, "released": 0})
    settled: tuple[tuple[Finished, float], ...] = ()


class GuardState(Protocol):
    """Breakers, limits and budget holds of every request; see the module docstring for the steps."""

    async def admit(self, step: AdmitStep) -> Admitted | Refusal:
        """Check everything, then charge everything (or nothing). Raises the 409 of a request id
        that holds already and the 429 of a breaker or a limit; returns the budget's ``Refusal``."""
        ...

    async def finish(self, step: FinishStep) -> Finished: ...

    def stream_tokens(self, request_id: str, key_id: str, session_id: str | None, n: int, now_s: float) -> bool:
        """Count ``n`` streamed output tokens; False when a velocity cap is crossed (cut the
        stream). A remote store counts them in batches and answers up to a batch late."""
        ...

    def trip_session_budget(self, key_id: str, session_id: str, now_s: float) -> None:
        """A stream crossed its session budget: open the session's breaker (a remote store: in
        the background)."""
        ...

    async def session_spend_usd(self, key_id: str, session_id: str) -> float:
        """The session's settled spend plus the worst cases of its requests in flight."""
        ...

    async def usage(self, charges: Sequence[Charge]) -> list[tuple[float, float]]:
        """(spent_usd, reserved_usd) of each charge."""
        ...

    async def key_tokens_per_s(self, key_id: str, now_s: float) -> float: ...

    def drain_trips(self) -> list[Trip]:
        """Breaker trips since the last call (for alerts and metrics)."""
        ...

    async def start(self, now_s: float) -> None:
        """Ready the store (a fleet's: its spend rebuilt from the ledger, once per data set)."""
        ...

    async def heartbeat(self, now_s: float) -> Upkeep:
        """Renew this process's leases, reclaim dead owners' holds, retry settles that failed."""
        ...

    async def drain(self) -> None:
        """Wait for the calls a remote store runs in the background (streamed tokens, trips)."""
        ...

    async def aclose(self) -> None: ...
