"""The hot path's Redis connection against a real redis-server: many scripts in flight on one
socket each get their own answer; an unknown script is loaded; a slow answer times out without
shifting later answers; a killed connection fails what was in flight and the next call reconnects."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from helpers.ports import free_port_base
from tokenomy.gateway.stores.redis_pipe import RedisPipe, pack
from tokenomy.gateway.stores.servers import RedisServer

pytestmark = pytest.mark.integration
ECHO = "redis.call('INCR', KEYS[1]) return {KEYS[1], ARGV[1], {tonumber(ARGV[2]) * 2}}"


def run_with(redis_srv: RedisServer, body: Callable[[Redis, RedisPipe], Awaitable[Any]], db: int = 0,
             timeout_s: float = 2.0) -> Any:
    async def main() -> Any:
        client = Redis.from_url(f"{redis_srv.url.rsplit('/', 1)[0]}/{db}")
        pipe = RedisPipe(f"{redis_srv.url.rsplit('/', 1)[0]}/{db}", timeout_s)
        try:
            return await body(client, pipe)
        finally:
            await pipe.aclose()
            await client.aclose()

    return asyncio.run(main())


def test_pack_is_one_resp_array_of_bulk_strings() -> None:
    assert pack([b"GET", b"k"]) == b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
    assert pack([b"SET", b"", b"a\r\nb"]) == b"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$4\r\na\r\nb\r\n"


def test_scripts_in_flight_together_each_get_their_own_answer(redis_srv: RedisServer) -> None:
    async def body(client: Redis, pipe: RedisPipe) -> None:
        script = client.register_script(ECHO)
        await client.script_flush()  # unknown to Redis: the first call loads it
        answers = await asyncio.gather(*(pipe.evalsha(script, [b"pipe:%d" % i], [b"a%d" % i, b"%d" % i])
                                         for i in range(200)))
        assert answers == [[b"pipe:%d" % i, b"a%d" % i, [2 * i]] for i in range(200)]
        assert int(await client.get("pipe:7") or 0) == 1  # each ran once
        with pytest.raises(ResponseError):
            await pipe.evalsha(client.register_script("return redis.call('NOPE')"), [], [])

    run_with(redis_srv, body)


def test_a_slow_answer_times_out_and_later_answers_stay_in_order(redis_srv: RedisServer) -> None:
    async def body(client: Redis, pipe: RedisPipe) -> None:
        script = client.register_script(ECHO)
        assert (await pipe.evalsha(script, [b"slow"], [b"first", b"1"]))[1] == b"first"
        await client.execute_command("CLIENT", "PAUSE", "400", "ALL")  # Redis answers nobody for 0.4 s
        with pytest.raises(TimeoutError):
            await pipe.evalsha(script, [b"slow"], [b"late", b"2"])
        # the paused call's answer arrives first and is dropped; this call (waiting out the pause)
        # gets its own
        pipe.timeout_s = 2.0
        assert await pipe.evalsha(script, [b"slow"], [b"next", b"3"]) == [b"slow", b"next", [6]]

    run_with(redis_srv, body, timeout_s=0.1)


def test_a_killed_connection_fails_in_flight_calls_and_the_next_call_reconnects(redis_srv: RedisServer) -> None:
    async def body(client: Redis, pipe: RedisPipe) -> None:
        script = client.register_script(ECHO)
        await pipe.evalsha(script, [b"k"], [b"x", b"1"])
        await client.execute_command("CLIENT", "PAUSE", "300", "WRITE")  # writes wait; CLIENT KILL does not
        in_flight = asyncio.ensure_future(pipe.evalsha(script, [b"k"], [b"y", b"1"]))
        await asyncio.sleep(0)
        await client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        with pytest.raises(RedisConnectionError):
            await in_flight
        assert await pipe.evalsha(script, [b"k"], [b"z", b"2"]) == [b"k", b"z", [4]]

    run_with(redis_srv, body)


def test_the_url_selects_the_database(redis_srv: RedisServer) -> None:
    async def body(client: Redis, pipe: RedisPipe) -> None:
        await pipe.evalsha(client.register_script(ECHO), [b"in-db-3"], [b"x", b"1"])
        assert await client.get("in-db-3") == b"1"

    run_with(redis_srv, body, db=3)


def test_while_redis_is_unreachable_calls_waiting_behind_a_failed_connect_fail_with_it() -> None:
    # a blackholed Redis must not queue every request behind its own connect timeout, and a Redis
    # that is back must be used by the next call
    attempts = 0

    class Unreachable(RedisPipe):
        async def _open(self) -> Any:
            nonlocal attempts
            attempts += 1
            await asyncio.sleep(0)  # the other calls queue behind this attempt meanwhile
            raise ConnectionRefusedError("refused")

    async def main() -> None:
        pipe = Unreachable(f"redis://127.0.0.1:{free_port_base(1)}/0", timeout_s=30.0)
        script = Redis().register_script(ECHO)  # only its sha and source are used
        calls = [pipe.evalsha(script, [b"k"], [b"x", b"1"]) for _ in range(5)]
        errors = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(e, RedisConnectionError) for e in errors) and attempts == 1
        with pytest.raises(RedisConnectionError, match="cannot connect"):
            await pipe.evalsha(script, [b"k"], [b"x", b"1"])  # a later call tries again
        assert attempts == 2

    asyncio.run(main())
