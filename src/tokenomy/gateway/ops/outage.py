"""What a fleet replica serves while its shared stores are down (``ops.shared.on_outage``).

Redis unreachable or slower than ``timeout_s`` (the guard state raises ``StoreUnavailable``): a
key is *budgeted* when any node on its path has a budget; its tier's mode either refuses (503
``store_unavailable`` with ``retry-after``) or admits against this replica's own in-process state
(``local``: each replica then allows a key its full limits), metered in the ledger as always.
The ledger (PostgreSQL) failing to commit: with ``ledger: outbox`` (the default) each event waits
in the replica's local durable outbox and requests are served as usual (the ``OutboxLedger``
never reports a failed commit); with ``ledger: refuse`` nothing is served that it could not
record (503 ``ledger_unavailable``); after ``retry_after_s`` requests go through again, and the
first commit that works ends the outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.metrics import OpsMetrics
from tokenomy.gateway.ops.tenancy import Node
from tokenomy.gateway.stores.guard_state import StoreUnavailable
from tokenomy.gateway.stores.local_state import LocalState
from tokenomy.gateway.stores.shared_config import OutageConfig

log = logging.getLogger(__name__)


class LedgerHealth(Protocol):
    @property
    def failed_at_s(self) -> float | None:
        """Monotonic time of the last failed commit; None once a commit succeeded."""
        ...


@dataclass(frozen=True, slots=True)
class OutagePolicy:
    config: OutageConfig
    local: LocalState  # this replica's own state, for the keys its tier serves locally
    ledger: LedgerHealth | None = None

    def _unavailable(self, code: str, message: str) -> GatewayError:
        return GatewayError(503, message, type="server_error", code=code,
                            headers={"retry-after": str(self.config.retry_after_s)})

    def check_ledger(self) -> None:
        """503 ``ledger_unavailable`` while the ledger's last commit failed (for ``retry_after_s``)."""
        failed = None if self.ledger is None else self.ledger.failed_at_s
        if failed is not None and time.monotonic() - failed < self.config.retry_after_s:
            raise self._unavailable("ledger_unavailable", "the usage ledger is unavailable; retry shortly")

    def fallback(self, path: Sequence[Node], err: StoreUnavailable, request_id: str, metrics: OpsMetrics) -> LocalState:
        """The state to admit ``request_id`` against while the shared one is down, or its 503."""
        budgeted = any(n.limits.budget_usd is not None for n in path)
        mode = self.config.budgeted if budgeted else self.config.unbudgeted
        log.warning("shared store unavailable (%s): %s request %s", err,
                    "refusing" if mode == "fail_closed" else "admitting locally", request_id)
        if mode == "fail_closed":
            raise self._unavailable("store_unavailable", "token-operations state store unavailable; retry shortly")
        metrics.refusals.labels("store_local").inc()  # a refusal's code is counted by the guard
        return self.local
