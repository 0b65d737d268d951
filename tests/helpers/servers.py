"""Real ``redis-server`` and PostgreSQL for the tests that are about the shared stores.

Started on loopback on free ports and always stopped. Where a server is not installed the test
skips with the reason, except in CI (``CI=true``), where it fails: CI installs both
(``make services``) and must run these tests, never skip them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from tokenomy.gateway.stores.servers import (
    PostgresServer,
    RedisServer,
    ServerMissing,
    find_pg_bindir,
    find_redis_server,
    start_postgres,
    start_redis,
)

_S = TypeVar("_S")


def _missing(e: ServerMissing) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run the shared-store tests: {e}")
    pytest.skip(str(e))


@contextmanager
def _running(start: Callable[[], _S], stop: Callable[[_S], None]) -> Iterator[_S]:
    """The server ``start()`` gives, stopped with ``stop`` after the block; a missing one skips (fails in CI)."""
    try:
        server = start()
    except ServerMissing as e:
        _missing(e)
        raise
    try:
        yield server
    finally:
        stop(server)


def redis_server(workdir: Path) -> AbstractContextManager[RedisServer]:
    """A fresh ``redis-server`` whose files live in ``workdir``; killed afterwards."""
    return _running(lambda: start_redis(workdir), RedisServer.kill)


def postgres_server() -> AbstractContextManager[PostgresServer]:
    """A fresh PostgreSQL cluster; stopped and removed afterwards."""
    return _running(start_postgres, lambda server: server.stop(remove=True))


def require_servers() -> None:
    """Skip (fail in CI) unless both ``redis-server`` and PostgreSQL are installed (for tests whose
    harness starts them itself)."""
    try:
        find_redis_server()
        find_pg_bindir()
    except ServerMissing as e:
        _missing(e)
