"""Real ``redis-server`` and PostgreSQL for the tests that are about the shared stores.

Started on loopback on free ports and always stopped. Where a server is not installed the test
skips with the reason, except in CI (``CI=true``), where it fails: CI installs both
(``make services``) and must run these tests, never skip them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tokenomy.gateway.stores.servers import (
    PostgresServer,
    RedisServer,
    ServerMissing,
    start_postgres,
    start_redis,
)


def _missing(e: ServerMissing) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run the shared-store tests: {e}")
    pytest.skip(str(e))


@contextmanager
def redis_server(workdir: Path) -> Iterator[RedisServer]:
    try:
        server = start_redis(workdir)
    except ServerMissing as e:
        _missing(e)
        raise
    try:
        yield server
    finally:
        server.kill()


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    try:
        server = start_postgres()
    except ServerMissing as e:
        _missing(e)
        raise
    try:
        yield server
    finally:
        server.stop(remove=True)
