"""What the Redis stores share: the client, the key prefix and the lease, and how answers are read."""

from __future__ import annotations

from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from tokenomy.gateway.stores.shared_config import SharedStoresConfig


def text(x: Any) -> str:
    """A Redis answer (bytes, or a number a script returned) as ``str``."""
    return x.decode() if isinstance(x, bytes) else str(x)


def redis_client(shared: SharedStoresConfig) -> Redis:
    """A replica's Redis client: at most ``redis_pool_size`` connections (callers beyond them wait
    for one: local queueing is not an outage); a call on a connection fails after ``timeout_s``."""
    retry = Retry(NoBackoff(), 1, (RedisConnectionError,))  # a pooled connection Redis closed: reconnect once
    pool = BlockingConnectionPool.from_url(shared.redis_url, max_connections=shared.redis_pool_size, timeout=None,
                                           socket_timeout=shared.timeout_s, socket_connect_timeout=shared.timeout_s,
                                           retry=retry)
    return Redis(connection_pool=pool, retry=retry)


class RedisStore:
    """A store in Redis: ``prefix`` starts each of its keys (tests give each test its own);
    ``lease_s``: how long a slot or hold outlives a replica that stopped renewing it."""

    def __init__(self, redis: Redis, lease_s: float = 30.0, prefix: str = "tk:") -> None:
        self.redis = redis
        self.lease_s = lease_s
        self.prefix = prefix
