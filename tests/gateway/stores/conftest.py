"""One redis-server and one PostgreSQL cluster for the store tests of a module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers.servers import postgres_server, redis_server
from tokenomy.gateway.stores.servers import PostgresServer, RedisServer


@pytest.fixture(scope="module")
def redis_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def pg_srv() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server
