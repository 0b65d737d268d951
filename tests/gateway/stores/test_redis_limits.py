"""RPM/TPM buckets and concurrency slots in a real redis-server, shared by several "replicas"
(separate clients): limits hold across them exactly, and a dead replica's slots end with their lease.
Times are simulated (``now_s`` is passed in); nothing sleeps."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.tenancy import NodeLimits
from tokenomy.gateway.stores.redis_limits import RedisRateLimits
from tokenomy.gateway.stores.servers import RedisServer

pytestmark = pytest.mark.integration
T0 = 1_800_000_000.0


def run_with(redis_srv: RedisServer, body: Callable[..., Awaitable[Any]], replicas: int = 1, lease_s: float = 2.0) -> Any:
    """Run ``body(*limits)`` with one RedisRateLimits per replica, each on its own connection,
    under a fresh key prefix."""
    prefix = f"t{secrets.token_hex(4)}:"

    async def main() -> Any:
        clients = [Redis.from_url(redis_srv.url) for _ in range(replicas)]
        try:
            return await body(*(RedisRateLimits(c, lease_s=lease_s, prefix=prefix) for c in clients))
        finally:
            for c in clients:
                await c.aclose()

    return asyncio.run(main())


def path(**key: Any) -> list[tuple[str, NodeLimits]]:
    return [("org", NodeLimits()), ("team", NodeLimits(rpm=3)), ("key", NodeLimits(**key))]


def test_rpm_holds_across_replicas_and_a_refusal_charges_nothing(redis_srv: RedisServer) -> None:
    async def body(a: RedisRateLimits, b: RedisRateLimits) -> None:
        p = path(rpm=10, tpm=1000)
        for i, rl in enumerate((a, b, a)):  # the team's 3 per minute, spread over two replicas
            grant = await rl.acquire(p, 100, T0, f"r{i}")
            await rl.finish(grant, f"r{i}")
        with pytest.raises(GatewayError) as e:
            await b.acquire(p, 100, T0, "r3")
        assert e.value.status == 429 and e.value.code == "rate_limit_rpm"
        assert e.value.headers["retry-after"] == "20"  # one request of 3/min refills in 20 s
        # the refused request charged no TPM on the key (all or nothing): 1000 - 3 x 100 left
        headers = await a.headers(p, T0)
        assert headers["x-ratelimit-remaining-tokens"] == "700"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        # 20 simulated seconds later one more request fits, on either replica
        grant = await b.acquire(p, 100, T0 + 20.0, "r4")
        assert grant.headers["x-ratelimit-remaining-requests"] == "0"

    run_with(redis_srv, body, replicas=2)


def test_tpm_is_corrected_to_actual_usage_on_every_node(redis_srv: RedisServer) -> None:
    async def body(a: RedisRateLimits) -> None:
        p = [("team", NodeLimits(tpm=10_000)), ("key", NodeLimits(tpm=1_000))]
        grant = await a.acquire(p, 900, T0, "r1")  # estimate
        assert grant.headers["x-ratelimit-remaining-tokens"] == "100"
        with pytest.raises(GatewayError) as e:
            await a.acquire(p, 200, T0, "r2")
        assert e.value.code == "rate_limit_tpm"
        await a.correct_tokens(grant, 150, T0)  # the request used 150 tokens
        headers = await a.headers(p, T0)
        assert headers["x-ratelimit-remaining-tokens"] == "850"
        await a.acquire(p, 200, T0, "r2")
        with pytest.raises(GatewayError) as e:  # more than the key's capacity can ever fit
            await a.acquire(p, 1_001, T0 + 600, "r3")
        assert e.value.code == "tokens_over_limit"

    run_with(redis_srv, body)


def test_concurrent_acquires_over_replicas_grant_exactly_the_limit(redis_srv: RedisServer) -> None:
    async def body(*replicas: RedisRateLimits) -> None:
        p = path(max_concurrent=5)
        p[1] = ("team", NodeLimits())

        async def one(i: int) -> bool:
            try:
                await replicas[i % len(replicas)].acquire(p, 10, T0, f"r{i}")
                return True
            except GatewayError as e:
                assert e.code == "concurrency_limit"
                return False

        granted = await asyncio.gather(*(one(i) for i in range(60)))
        assert sum(granted) == 5
        assert await replicas[0].in_flight("key", T0) == 5

    run_with(redis_srv, body, replicas=3)


def test_a_dead_replicas_slots_end_with_their_lease_and_renewal_keeps_a_live_one(redis_srv: RedisServer) -> None:
    async def body(a: RedisRateLimits, b: RedisRateLimits) -> None:
        p = [("key", NodeLimits(max_concurrent=2))]
        await a.acquire(p, 1, T0, "dead-1")  # replica a dies holding this slot
        live = await b.acquire(p, 1, T0, "live-1")
        with pytest.raises(GatewayError):
            await b.acquire(p, 1, T0 + 1.9, "x")  # within the 2 s lease: both slots are taken
        await b.renew([("live-1", ["key"])], T0 + 1.9)  # b's heartbeat renews its own slot
        await b.acquire(p, 1, T0 + 2.5, "new-1")  # a's lease passed: its slot is free again
        with pytest.raises(GatewayError):
            await b.acquire(p, 1, T0 + 2.5, "new-2")  # b's renewed slot still counts
        await b.finish(live, "live-1")
        await b.finish(live, "live-1")  # idempotent
        assert await b.in_flight("key", T0 + 2.5) == 1

    run_with(redis_srv, body, replicas=2)
