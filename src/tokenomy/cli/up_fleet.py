"""``tokenomy up`` with a ``fleet:`` section: Redis, PostgreSQL and N gateway replicas in front of
the emulated engines, all on loopback, all stopped with the cluster (docs/gateway-ops.md).

    fleet:
      replicas: 3          # gateway processes sharing one Redis and one PostgreSQL
      port_base: 8000      # replica i listens on port_base + i
      gateway: {...}       # more gateway.yaml (ops.tenants, routing, prices...); backends and
                           # ops.shared are filled in
"""

from __future__ import annotations

import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tokenomy.emulator.cluster import Instance
from tokenomy.gateway.http.replicas import Replica, start_replicas, stop_all
from tokenomy.gateway.stores.servers import PostgresServer, RedisServer, start_postgres, start_redis


class FleetSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    replicas: int = Field(default=3, ge=1, le=32)
    port_base: int = Field(default=8000, ge=1, le=65535)
    gateway: dict[str, Any] = Field(default_factory=dict)


def split_fleet(data: dict[str, Any]) -> tuple[dict[str, Any], FleetSpec | None]:
    """The cluster part of a cluster file and its ``fleet:`` section (None when absent)."""
    if "fleet" not in data:
        return data, None
    rest = {k: v for k, v in data.items() if k != "fleet"}
    return rest, FleetSpec.model_validate(data["fleet"] or {})


def gateway_config(spec: FleetSpec, instances: list[Instance], redis_url: str, pg_url: str,
                   workdir: Path) -> dict[str, Any]:
    cfg = dict(spec.gateway)
    cfg["backends"] = [{"id": i.instance_id, "url": i.url, "role": i.role, "models": [i.model]} for i in instances]
    ops = dict(cfg.get("ops") or {})
    ops.setdefault("server_secret", secrets.token_urlsafe(24))  # shared by the replicas of this run
    # the replicas' ledger outboxes live with the run (not in the directory `up` was started from)
    ops["shared"] = {"outbox_dir": str(workdir), **(ops.get("shared") or {}), "redis_url": redis_url,
                     "postgres_url": pg_url}
    cfg["ops"] = ops
    return cfg


@dataclass
class LocalFleet:
    spec: FleetSpec
    instances: list[Instance]
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tokenomy-fleet-")))
    redis: RedisServer | None = None
    pg: PostgresServer | None = None
    replicas: list[Replica] = field(default_factory=list)

    def start(self) -> list[Replica]:
        self.redis = start_redis(self.workdir / "redis")
        self.pg = start_postgres(durable=True)
        path = self.workdir / "gateway.yaml"
        path.write_text(yaml.safe_dump(gateway_config(self.spec, self.instances, self.redis.url, self.pg.url,
                                                       self.workdir)))
        ports = [self.spec.port_base + i for i in range(self.spec.replicas)]
        self.replicas = start_replicas(path, ports, self.workdir)
        return self.replicas

    def dead(self) -> list[Replica]:
        return [r for r in self.replicas if r.proc is not None and r.proc.poll() is not None]

    def stop(self) -> None:
        stop_all(self.replicas)
        if self.redis is not None:
            self.redis.stop()
        if self.pg is not None:
            self.pg.stop(remove=True)
