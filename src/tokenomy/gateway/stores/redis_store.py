"""What the Redis stores share: the client, the key prefix and the lease, and how answers are read."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis


def text(x: Any) -> str:
    """A Redis answer (bytes, or a number a script returned) as ``str``."""
    return x.decode() if isinstance(x, bytes) else str(x)


class RedisStore:
    """A store in Redis: ``prefix`` starts each of its keys (tests give each test its own);
    ``lease_s``: how long a slot or hold outlives a replica that stopped renewing it."""

    def __init__(self, redis: Redis, lease_s: float = 30.0, prefix: str = "tk:") -> None:
        self.redis = redis
        self.lease_s = lease_s
        self.prefix = prefix
