"""Routing reads fleet-wide in-flight counts: two replicas sharing one redis-server (and one
PostgreSQL) in front of two backends. Requests held open on one backend through replica A make
replica B send its next request to the other backend; once A is SIGKILLed, its published counts
lapse with their lease and B routes to the first backend again."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import yaml
from redis import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from helpers.gateway_core_support import MODEL, free_port, serve
from helpers.polling import wait_for
from helpers.servers import postgres_server, redis_server
from tokenomy.gateway.http.replicas import Replica, start_replicas, stop_all
from tokenomy.gateway.ops.keys import new_api_key

pytestmark = pytest.mark.integration
PINNED = "pinned-model"  # served by b0 only: replica A's held requests all land there
LEASE_S = 1.0


@dataclass
class HoldingUpstream:
    """An OpenAI-style backend that answers at once, except requests for ``PINNED``: those it holds
    until ``release`` is set (30 s at most)."""

    models: list[str] = field(default_factory=list)  # the model of each request it received
    release: threading.Event = field(default_factory=threading.Event)

    def app(self) -> Starlette:
        async def completion(request: Request) -> Response:
            body = await request.json()
            self.models.append(body["model"])
            deadline = time.monotonic() + 30
            while body["model"] == PINNED and not self.release.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            return JSONResponse({"id": "c", "object": "chat.completion", "model": body["model"], "choices": [choice],
                                 "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}})

        async def health(request: Request) -> Response:
            return PlainTextResponse("ok")

        return Starlette(routes=[Route("/v1/chat/completions", completion, methods=["POST"]),
                                 Route("/health", health)])


@dataclass
class Fleet:
    a: Replica
    b: Replica
    b0: HoldingUpstream
    b1: HoldingUpstream
    redis_url: str
    key: str

    def chat(self, replica: Replica, model: str, timeout: float = 30.0) -> httpx.Response:
        return httpx.post(f"{replica.url}/v1/chat/completions", timeout=timeout,
                          headers={"authorization": f"Bearer {self.key}"},
                          json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet-routing")
    b0, b1 = HoldingUpstream(), HoldingUpstream()
    key = new_api_key()
    price = {"input_per_mtok": 1.0, "cached_input_per_mtok": 1.0, "output_per_mtok": 2.0}
    with (redis_server(tmp) as redis, postgres_server() as pg, serve(b0.app()) as url0, serve(b1.app()) as url1):
        config = tmp / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "backends": [{"id": "b0", "url": url0, "models": [MODEL, PINNED]}, {"id": "b1", "url": url1}],
            "router": {"name": "least_loaded"},
            "prices": {MODEL: price, PINNED: price},
            "ops": {"server_secret": "r" * 32,
                    "shared": {"redis_url": redis.url, "postgres_url": pg.url, "timeout_s": 5.0,
                               "in_flight_period_s": 0.1, "in_flight_lease_s": LEASE_S, "outbox_dir": str(tmp)},
                    "tenants": [{"org": "o", "teams": [{"name": "t", "keys": [{"name": "k", "key": key}]}]}]},
        }))
        replicas = start_replicas(config, [free_port() for _ in range(2)], tmp)
        try:
            yield Fleet(replicas[0], replicas[1], b0, b1, redis.url, key)
        finally:
            b0.release.set()
            stop_all(replicas)


def routed_in_flight(replica: Replica, backend: str) -> float:
    """What ``replica``'s routing counts in flight on ``backend`` (its ``/metrics``)."""
    prefix = f'tokenomy_gateway_fleet_in_flight{{backend="{backend}"}} '
    text = httpx.get(f"{replica.url}/metrics", timeout=5).text
    return float(next(line for line in text.splitlines() if line.startswith(prefix)).rsplit(" ", 1)[1])


def test_a_backend_busy_through_one_replica_is_busy_for_the_other_until_that_replica_dies(fleet: Fleet) -> None:
    held_errors: list[str] = []

    def hold() -> None:
        try:
            fleet.chat(fleet.a, PINNED)
        except httpx.HTTPError as e:  # replica A is killed while these are held
            held_errors.append(repr(e))

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: fleet.b0.models.count(PINNED) == 2, timeout_s=10, what="A's two requests to reach b0")
        wait_for(lambda: routed_in_flight(fleet.b, "b0") == 2, timeout_s=5,
                 what="replica B to count A's two requests on b0")
        # b0 has the lower id and B forwarded nothing itself: only A's counts can send this to b1
        r = fleet.chat(fleet.b, MODEL)
        assert r.status_code == 200, r.text
        assert fleet.b1.models == [MODEL] and MODEL not in fleet.b0.models
        fleet.a.kill()  # its counts stay in Redis until their lease passes
        wait_for(lambda: routed_in_flight(fleet.b, "b0") == 0, timeout_s=LEASE_S + 5,
                 what="the killed replica's counts to lapse")
        client = Redis.from_url(fleet.redis_url)
        try:
            assert client.hlen("tk:if:b0") == 1  # B's own field; A's was deleted by a reader
        finally:
            client.close()
        r = fleet.chat(fleet.b, MODEL)  # b0 is idle again as far as the fleet knows
        assert r.status_code == 200, r.text
        assert fleet.b0.models.count(MODEL) == 1 and fleet.b1.models == [MODEL]
    finally:
        fleet.b0.release.set()
        for t in threads:
            t.join(30)
