"""Agent breakers with their state in a real redis-server: a runaway agent spread over replicas is
cut at the same turn as through one, even when its turns race. Simulated times; nothing sleeps."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.ops.breaker import BreakerConfig
from tokenomy.gateway.stores.redis_breakers import RedisBreakers
from tokenomy.gateway.stores.servers import RedisServer

pytestmark = pytest.mark.integration
T0 = 1_800_000_000.0


def run_with(redis_srv: RedisServer, config: BreakerConfig, body: Callable[..., Awaitable[Any]],
             replicas: int = 3) -> Any:
    prefix = f"t{secrets.token_hex(4)}:"

    async def main() -> Any:
        clients = [Redis.from_url(redis_srv.url) for _ in range(replicas)]
        try:
            return await body(*(RedisBreakers(c, config, prefix=prefix) for c in clients))
        finally:
            for c in clients:
                await c.aclose()

    return asyncio.run(main())


async def turns_until_cut(replicas: tuple[RedisBreakers, ...], fingerprint: Callable[[int], str | None],
                          limit: int = 50) -> tuple[int, str]:
    """Round-robin one agent's turns over ``replicas``; the 1-based turn that was refused and its code."""
    for turn in range(1, limit + 1):
        try:
            await replicas[turn % len(replicas)].admit("k1", "s1", fingerprint(turn), 10, 0.0, T0 + turn)
        except GatewayError as e:
            return turn, str(e.code)
    raise AssertionError("never cut")


def test_a_runaway_agent_is_cut_at_the_same_turn_over_three_replicas_as_through_one(redis_srv: RedisServer) -> None:
    cfg = BreakerConfig(max_turns_per_session=7, repeat_limit=4)
    one = run_with(redis_srv, cfg, lambda *r: turns_until_cut(r, lambda t: f"fp{t}"), replicas=1)
    three = run_with(redis_srv, cfg, lambda *r: turns_until_cut(r, lambda t: f"fp{t}"), replicas=3)
    assert one == three == (8, "breaker_turn_cap")
    one = run_with(redis_srv, cfg, lambda *r: turns_until_cut(r, lambda t: "same-tool-call"), replicas=1)
    three = run_with(redis_srv, cfg, lambda *r: turns_until_cut(r, lambda t: "same-tool-call"), replicas=3)
    assert one == three == (4, "breaker_repetition")


def test_racing_turns_of_one_session_never_pass_the_cap(redis_srv: RedisServer) -> None:
    async def body(*replicas: RedisBreakers) -> None:
        async def one(i: int) -> bool:
            try:
                await replicas[i % 3].admit("k1", "s1", f"fp{i}", 10, 0.0, T0)
                return True
            except GatewayError as e:
                assert e.code == "breaker_turn_cap"
                return False

        admitted = await asyncio.gather(*(one(i) for i in range(30)))
        assert sum(admitted) == 5
        # the cooldown holds on every replica; after it, the cap still holds (turns are kept)
        with pytest.raises(GatewayError) as e:
            await replicas[2].admit("k1", "s1", None, 10, 0.0, T0 + 59.0)
        assert e.value.headers["retry-after"] == "1"
        assert sum(len(r.trips) for r in replicas) == 1  # one trip, one alert

    run_with(redis_srv, BreakerConfig(max_turns_per_session=5), body)


def test_session_budget_counts_in_flight_worst_cases_then_actual_costs(redis_srv: RedisServer) -> None:
    async def body(a: RedisBreakers, b: RedisBreakers, c: RedisBreakers) -> None:
        await a.admit("k1", "s1", None, 10, 0.6, T0)
        assert await b.session_budget_left_usd("k1", "s1") == pytest.approx(0.3)
        await b.admit("k1", "s1", None, 10, 0.3, T0 + 1)
        await a.finish("k1", "s1", 0.6, 0.2)  # the first turn cost $0.2 of its $0.6 worst case
        await b.finish("k1", "s1", 0.3, 0.75)
        with pytest.raises(GatewayError) as e:
            await c.admit("k1", "s1", None, 10, 0.1, T0 + 2)
        assert e.value.code == "breaker_session_budget"

    run_with(redis_srv, BreakerConfig(session_budget_usd=0.9, max_turns_per_session=None), body)


def test_velocity_over_replicas_cuts_the_stream_and_opens_the_key(redis_srv: RedisServer) -> None:
    async def body(a: RedisBreakers, b: RedisBreakers, c: RedisBreakers) -> None:
        await a.admit("k1", None, None, 400, 0.0, T0)
        assert await b.add_tokens("k1", None, 500, T0 + 1)
        assert not await c.add_tokens("k1", None, 200, T0 + 2)  # 1100 > 1000 per minute: cut
        with pytest.raises(GatewayError) as e:
            await a.admit("k1", None, None, 1, 0.0, T0 + 3)
        assert e.value.code == "breaker_velocity"
        assert await a.key_tokens_per_s("k1", T0 + 61.5) == pytest.approx(200 / 60)  # old events left the window

    run_with(redis_srv, BreakerConfig(key_tokens_per_min=1000, cooldown_s=10.0), body)
