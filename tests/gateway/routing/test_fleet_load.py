"""The fleet's in-flight counts as routing reads them: own live count plus the other replicas' last
published ones; when the shared store fails, this replica's own counts alone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

import httpx
from redis.exceptions import ConnectionError as RedisConnectionError

from tokenomy.core import Request
from tokenomy.gateway.config import BackendConfig, HealthConfig
from tokenomy.gateway.routing.backends import BackendPool
from tokenomy.gateway.routing.fleet_load import FleetLoad
from tokenomy.policy.router import LeastLoadedRouter


class ScriptedStore:
    """Answers ``exchange`` from a list (an exception: the store is down); records what was published."""

    def __init__(self, answers: list[dict[str, int] | Exception]) -> None:
        self.answers = answers
        self.published: list[dict[str, int]] = []
        self.left: list[str] = []

    async def exchange(self, own: Mapping[str, int]) -> dict[str, int]:
        self.published.append(dict(own))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def leave(self, backend_ids: Iterable[str]) -> None:
        self.left.extend(backend_ids)


def test_routing_adds_the_other_replicas_counts_and_falls_back_to_its_own_when_the_store_fails() -> None:
    async def main() -> None:
        async with httpx.AsyncClient() as client:
            pool = BackendPool((BackendConfig(id="b0", url="http://127.0.0.1:1"),
                                BackendConfig(id="b1", url="http://127.0.0.1:2")), HealthConfig(), client)
            store = ScriptedStore([{"b0": 3, "b1": 0}, RedisConnectionError("down"), {"b0": 1, "b1": 0}])
            load = FleetLoad(pool, store, period_s=0.2)
            b0, b1 = pool.backends
            b1.dispatched("own-1", 10)  # this replica's own request on b1, past its prefill: the
            b1.first_token("own-1")  # routers' first key (prompt tokens waiting) is 0 on both

            def pick() -> str:
                req = Request(request_id="r", arrival_s=0.0, prompt_tokens=10, max_output_tokens=1)
                return LeastLoadedRouter().choose(req, pool.backends, 0.0)

            await load.sync()
            assert store.published[-1] == {"b0": 0, "b1": 1}  # own counts only, never the others'
            assert (b0.in_flight, b1.in_flight) == (3, 1) and pick() == "b1"
            await load.sync()  # Redis down: the others' counts are dropped, not kept stale
            assert not load.store_ok and (b0.in_flight, b1.in_flight) == (0, 1) and pick() == "b0"
            await load.sync()
            assert load.store_ok and (b0.in_flight, b1.in_flight) == (1, 1)
            await load.stop()
            assert store.left == ["b0", "b1"]

    asyncio.run(main())
