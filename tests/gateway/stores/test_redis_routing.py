"""Session bindings and per-backend in-flight counts in a real redis-server, shared by replicas."""

from __future__ import annotations

import asyncio
import secrets

import pytest
from redis.asyncio import Redis

from helpers.polling import wait_for
from tokenomy.gateway.stores.redis_routing import RedisInFlight, RedisSessionBindings
from tokenomy.gateway.stores.servers import RedisServer

pytestmark = pytest.mark.integration


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


def test_each_replica_reads_the_others_in_flight_counts_and_a_dead_replicas_lapse(redis_srv: RedisServer) -> None:
    prefix = f"t{secrets.token_hex(4)}:"
    loop = asyncio.new_event_loop()
    client = Redis.from_url(redis_srv.url)
    try:
        a = RedisInFlight(client, "a", lease_s=0.3, prefix=prefix)  # stops publishing: its counts lapse
        b, c = (RedisInFlight(client, r, lease_s=30.0, prefix=prefix) for r in ("b", "c"))
        run = loop.run_until_complete
        assert run(a.exchange({"d0": 2, "d1": 1})) == {"d0": 0, "d1": 0}
        assert run(b.exchange({"d0": 1, "d1": 0})) == {"d0": 2, "d1": 1}
        assert run(c.exchange({"d0": 0, "d1": 0, "d2": 4})) == {"d0": 3, "d1": 1, "d2": 0}
        assert run(a.exchange({"d0": 1, "d1": 1})) == {"d0": 1, "d1": 0}  # its own never counted twice
        assert run(b.exchange({"d0": 1, "d1": 0, "d2": 0})) == {"d0": 1, "d1": 1, "d2": 4}
        wait_for(lambda: run(c.exchange({"d0": 0, "d1": 0, "d2": 4})) == {"d0": 1, "d1": 0, "d2": 0},
                 timeout_s=5.0, what="replica a's counts to lapse with its lease")
        assert not run(client.hexists(f"{prefix}if:d0", "a"))  # the reader deleted them
        run(b.leave(["d0", "d1", "d2"]))  # a clean shutdown withdraws at once
        assert run(c.exchange({"d0": 0})) == {"d0": 0}
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()
