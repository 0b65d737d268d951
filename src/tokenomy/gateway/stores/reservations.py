"""Budget reservations: the state interface and its in-process implementation.

A *hold* is one request's worst-case cost, reserved against every (node, period) it is charged to.
Invariant kept by every implementation, for each (node, period) with a budget:

    spent_usd + reserved_usd <= budget_usd     (checked and applied atomically in ``reserve``)

``settle`` moves a hold's amount out of ``reserved`` and its actual cost into ``spent``;
``release`` only returns the reservation. Both are idempotent: a second call for the same request
id finds no hold and changes nothing. ``Reservations`` is the hold store of one process's
``local_state.LocalState`` (synchronous: it runs inside the state's lock); a fleet's holds follow
the same rules in Lua (``redis_reservations.HOLDS_LUA``), held to the same contract tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

Charge = tuple[str, str]  # (node_id, period_key)


@dataclass(frozen=True, slots=True)
class Hold:
    request_id: str
    charges: tuple[Charge, ...]
    amount_usd: float
    expires_at_s: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why ``reserve`` refused: the first charge whose budget the hold would exceed."""

    charge: Charge
    budget_usd: float
    spent_usd: float
    reserved_usd: float


class Reservations(Protocol):
    def reserve(self, hold: Hold, budgets_usd: Mapping[Charge, float]) -> Refusal | None:
        """Record ``hold`` if it fits every budget (None), else change nothing and say why.

        Charges without an entry in ``budgets_usd`` are counted but never refuse. A request id
        that already holds a reservation is accepted again without a second charge.
        """
        ...

    def settle(self, request_id: str, actual_usd: float) -> Hold | None: ...

    def release(self, request_id: str) -> Hold | None: ...

    def usage(self, charge: Charge) -> tuple[float, float]:
        """(spent_usd, reserved_usd) of one node in one period."""
        ...

    def holds(self) -> list[Hold]: ...


class InProcessReservations:
    """``Reservations`` in memory: exact within one process (each call runs to its end, under
    ``LocalState``'s lock).

    Holds die with the process; spend is seeded at start-up from the ledger
    (``budget_seed.seed_from_ledger``), so a restart neither holds nor forgets anything.
    """

    def __init__(self) -> None:
        self._spent: dict[Charge, float] = {}
        self._reserved: dict[Charge, float] = {}
        self._holds: dict[str, Hold] = {}

    def seed_spent(self, charge: Charge, spent_usd: float) -> None:
        self._spent[charge] = spent_usd

    def reserve(self, hold: Hold, budgets_usd: Mapping[Charge, float]) -> Refusal | None:
        if hold.request_id in self._holds:
            return None
        for charge in hold.charges:
            budget = budgets_usd.get(charge)
            if budget is None:
                continue
            spent, reserved = self.usage(charge)
            if spent + reserved + hold.amount_usd > budget + 1e-12:
                return Refusal(charge, budget, spent, reserved)
        for charge in hold.charges:
            self._reserved[charge] = self._reserved.get(charge, 0.0) + hold.amount_usd
        self._holds[hold.request_id] = hold
        return None

    def _unhold(self, request_id: str) -> Hold | None:
        hold = self._holds.pop(request_id, None)
        if hold is not None:
            for charge in hold.charges:
                self._reserved[charge] = max(0.0, self._reserved.get(charge, 0.0) - hold.amount_usd)
        return hold

    def settle(self, request_id: str, actual_usd: float) -> Hold | None:
        hold = self._unhold(request_id)
        if hold is not None:
            for charge in hold.charges:
                self._spent[charge] = self._spent.get(charge, 0.0) + actual_usd
        return hold

    def release(self, request_id: str) -> Hold | None:
        return self._unhold(request_id)

    def usage(self, charge: Charge) -> tuple[float, float]:
        return self._spent.get(charge, 0.0), self._reserved.get(charge, 0.0)

    def holds(self) -> list[Hold]:
        return list(self._holds.values())
