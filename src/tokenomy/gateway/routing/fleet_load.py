"""Fleet-wide in-flight counts for routing, kept fresh off the request path.

In a fleet each replica sees only the requests it forwarded itself: three replicas would each
take a backend for a third as busy as it is. Every ``period_s`` :class:`FleetLoad` publishes this
replica's own count per backend and reads the other replicas' sums in one store call
(:class:`tokenomy.gateway.stores.in_flight.InFlightExchange`); :attr:`Backend.in_flight`, which
the routers read, is then the own live count plus the others' last published ones (at most
``period_s`` old). Routing never waits on the store. When the store fails, the others' counts
are dropped: routing falls back to this replica's own counts until the store answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.exceptions import RedisError

from tokenomy.gateway.routing.backends import BackendPool
from tokenomy.gateway.routing.periodic import Periodic
from tokenomy.gateway.stores.in_flight import InFlightExchange

log = logging.getLogger(__name__)
_STORE_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


class FleetLoad:
    def __init__(self, pool: BackendPool, store: InFlightExchange, period_s: float) -> None:
        self.pool = pool
        self.store = store
        self.period_s = period_s
        self.store_ok = True
        self._loop = Periodic("fleet in-flight sync", self.sync, period_s)

    async def sync(self) -> None:
        """Publish this replica's counts and take the others' (zero when the store fails)."""
        own = {b.instance_id: b.own_in_flight for b in self.pool.backends}
        try:
            others = await self.store.exchange(own)
        except _STORE_ERRORS as e:
            if self.store_ok:
                log.warning("fleet in-flight counts unavailable (%s): routing by this replica's own", e)
            self.store_ok = False
            others = {}
        else:
            if not self.store_ok:
                log.info("fleet in-flight counts back")
            self.store_ok = True
        for b in self.pool.backends:
            b.others_in_flight = others.get(b.instance_id, 0)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        """Stop syncing and withdraw this replica's counts (they would otherwise last a lease)."""
        await self._loop.stop()
        with contextlib.suppress(*_STORE_ERRORS):
            await self.store.leave([b.instance_id for b in self.pool.backends])
