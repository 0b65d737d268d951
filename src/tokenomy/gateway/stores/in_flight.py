"""Per-backend in-flight counts shared by a fleet's replicas: what routing reads of the others.

Embedded (one process) has nothing to share: a backend's count is the process's own. A fleet
(``ops.shared``) uses :class:`tokenomy.gateway.stores.redis_routing.RedisInFlight`;
:class:`tokenomy.gateway.routing.fleet_load.FleetLoad` calls it off the request path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol


class InFlightExchange(Protocol):
    async def exchange(self, own: Mapping[str, int]) -> dict[str, int]:
        """Publish this replica's requests in flight per backend id (they count until the lease
        ends unless published again); the sums of every other live replica's last published
        counts, per backend id of ``own``."""
        ...

    async def leave(self, backend_ids: Iterable[str]) -> None:
        """Withdraw this replica's counts at once (a clean shutdown)."""
        ...
