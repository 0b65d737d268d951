"""``GuardState`` in one process: the embedded default, and a fleet replica's fallback in an outage.

Breakers (``ops.breaker.Breakers``) and buckets and slots (``limits.InProcessRateLimits``) live in
memory; budget holds in a ``Reservations`` store: in memory (``InProcessReservations``) or SQLite
(``reservations_sql.SqlReservations``, shared by the processes on one file). Each step runs
under this object's lock, with no await inside: checks first, then charges, so a refusal changes
nothing (the SQLite reservation is itself one transaction).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.breaker import BreakerConfig, Breakers, Trip
from tokenomy.gateway.stores.guard_state import AdmitStep, Admitted, Finished, FinishStep, Upkeep
from tokenomy.gateway.stores.limits import InProcessRateLimits
from tokenomy.gateway.stores.reservations import Charge, Refusal, Reservations


class LocalState:
    """``GuardState`` over memory and a ``Reservations`` store."""

    def __init__(self, reservations: Reservations, breaker: BreakerConfig) -> None:
        self.reservations = reservations
        self.limits = InProcessRateLimits()
        self.breakers = Breakers(breaker)
        self._lock = threading.Lock()
        self._open: set[str] = set()  # request ids admitted and not finished

    async def admit(self, step: AdmitStep) -> Admitted | Refusal:
        with self._lock:
            rid = step.request_id
            if rid in self._open:
                raise GatewayError(409, f"request id {rid!r} is already in flight", code="duplicate_request_id")
            self.breakers.admit_check(step.key_id, step.session_id, step.fingerprint, step.now_s, step.session_need_usd)
            plan = self.limits.check(step.path, step.tokens, step.now_s)
            refusal = self.reservations.reserve(step.hold, step.budgets_usd)
            if refusal is not None:
                return refusal
            headers = self.limits.charge(plan, [n for n, _ in step.path])
            self.breakers.admit_count(step.key_id, step.session_id, step.fingerprint, step.prompt_tokens,
                                      step.hold.amount_usd, step.now_s)
            self._open.add(rid)
            usage = self.reservations.usage
            return Admitted(headers, tuple([usage(c)[0] for c in step.hold.charges]))

    async def finish(self, step: FinishStep) -> Finished:
        with self._lock:
            rid = step.request_id
            if step.actual_usd is None:
                hold = self.reservations.release(rid)
            else:
                hold = self.reservations.settle(rid, step.actual_usd)
            if rid in self._open:  # slots, TPM and the session's cost: once, like the hold
                self._open.discard(rid)
                self.limits.correct_tokens(step.node_ids, step.estimate_tokens, step.actual_tokens, step.now_s)
                self.limits.finish(step.node_ids)
                self.breakers.finish(step.key_id, step.session_id, step.worst_usd, step.actual_usd or 0.0,
                                     undo_turn=step.undo_turn)
            if hold is None:
                return Finished(None)
            return Finished(hold, {c: self.reservations.usage(c)[0] for c in hold.charges})

    def stream_tokens(self, request_id: str, key_id: str, session_id: str | None, n: int, now_s: float) -> bool:
        with self._lock:
            return self.breakers.on_tokens(key_id, session_id, n, now_s)

    def trip_session_budget(self, key_id: str, session_id: str, now_s: float) -> None:
        with self._lock:
            self.breakers.budget_crossed(key_id, session_id, now_s)

    async def session_spend_usd(self, key_id: str, session_id: str) -> float:
        with self._lock:
            return self.breakers.session_spend_usd(key_id, session_id)

    async def usage(self, charges: Sequence[Charge]) -> list[tuple[float, float]]:
        with self._lock:
            return [self.reservations.usage(c) for c in charges]

    async def key_tokens_per_s(self, key_id: str, now_s: float) -> float:
        with self._lock:
            return self.breakers.key_tokens_per_s(key_id, now_s)

    def drain_trips(self) -> list[Trip]:
        if not self.breakers.trips:  # the common case, once per streamed chunk: allocate nothing
            return []
        with self._lock:
            trips, self.breakers.trips = self.breakers.trips, []
        return trips

    async def start(self, now_s: float) -> None:
        return None

    async def heartbeat(self, now_s: float) -> Upkeep:
        return Upkeep()  # nothing leased: holds die with the process (SQLite: reconciled at start-up)

    async def drain(self) -> None:
        return None  # nothing runs in the background

    async def aclose(self) -> None:
        return None
