"""Session bindings and per-backend in-flight counts in a real redis-server, shared by replicas."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from redis.asyncio import Redis

from tokenomy.gateway.stores.redis_routing import RedisInFlight, RedisSessionBindings
from tokenomy.gateway.stores.servers import RedisServer

pytestmark = pytest.mark.integration
T0 = 1_800_000_000.0


def test_racing_replicas_bind_a_session_to_one_instance_and_rebind_by_compare_and_set(redis_srv: RedisServer) -> None:
    prefix = f"t{secrets.token_hex(4)}:"

    async def main() -> None:
        clients = [Redis.from_url(redis_srv.url) for _ in range(3)]
        try:
            stores = [RedisSessionBindings(c, prefix=prefix) for c in clients]
            # three replicas each picked a different instance for the session's first turn
            held = await asyncio.gather(*(s.claim("sess", f"decode-{i}") for i, s in enumerate(stores)))
            assert len(set(held)) == 1
            winner = held[0]
            assert await stores[2].get("sess") == winner
            # two replicas rebind from what they saw: only the first move holds
            assert await stores[0].move("sess", winner, "decode-9") == "decode-9"
            assert await stores[1].move("sess", winner, "decode-8") == "decode-9"
            await stores[1].unbind("sess")
            assert await stores[0].get("sess") is None
        finally:
            for c in clients:
                await c.aclose()

    asyncio.run(main())


def test_in_flight_counts_cover_the_fleet_and_drop_a_dead_replicas_requests(redis_srv: RedisServer) -> None:
    prefix = f"t{secrets.token_hex(4)}:"

    async def main() -> None:
        a_client, b_client = Redis.from_url(redis_srv.url), Redis.from_url(redis_srv.url)
        try:
            a, b = RedisInFlight(a_client, lease_s=2.0, prefix=prefix), RedisInFlight(b_client, lease_s=2.0, prefix=prefix)
            await a.dispatched("d0", "a1", T0)
            await a.dispatched("d1", "a2", T0)
            await b.dispatched("d0", "b1", T0)
            assert await b.counts(["d0", "d1", "d2"], T0 + 1) == {"d0": 2, "d1": 1, "d2": 0}
            await b.renew([("d0", "b1")], T0 + 1.5)  # replica a died: only b renews
            assert await a.counts(["d0", "d1"], T0 + 2.5) == {"d0": 1, "d1": 0}
            await b.finished("d0", "b1")
            assert await a.counts(["d0"], T0 + 2.5) == {"d0": 0}
        finally:
            await a_client.aclose()
            await b_client.aclose()

    asyncio.run(main())
