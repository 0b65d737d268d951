"""The ``ops`` section of the gateway config, and opening its tenant database.

Core's ``GatewayConfig`` keeps ``ops`` as a mapping; :func:`ops_config` validates it here, so a
bad field is one line naming it (``ops.breaker.repeat_limit: ...``), never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.engine import Engine

from tokenomy.gateway.ops.admission import AdmissionConfig
from tokenomy.gateway.ops.alerts import AlertsConfig
from tokenomy.gateway.ops.breaker import BreakerConfig
from tokenomy.gateway.ops.budget import PriceLike
from tokenomy.gateway.ops.tenancy_seed import TenantSeed
from tokenomy.gateway.stores.shared_config import SharedStoresConfig
from tokenomy.gateway.stores.tenancy_sql import TenantStore, sqlite_engine, stored_secret


class OpsConfig(BaseModel):
    """The gateway config's ``ops`` section. See docs/gateway-ops.md."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    server_secret: str | None = Field(default=None, min_length=16,
                                      description="HMAC secret for key digests; None: kept in the database")
    admin_key: str | None = Field(default=None, min_length=16, description="bearer key of /admin; None: off")
    db_url: str | None = Field(default=None, description="SQLAlchemy URL; None: the ledger's database")
    reservations: Literal["sql", "memory"] = Field(
        default="memory", description="sql: holds and spend in the database, reconciled after a crash, shared "
                                   "by processes on one file; memory: in process, spend rebuilt from the "
                                   "ledger at start-up (one process; fewer statements per request)")
    hold_ttl_s: float = Field(default=3600.0, gt=0, description="a hold older than this is reconciled")
    prompt_reserve_factor: float = Field(
        default=1.0, ge=1.0, le=8.0,
        description="reserve this many times the request path's prompt estimate (~4 characters a token); "
                    "4.0 bounds any ASCII prompt, so spend can never pass a budget")
    tenant_refresh_s: float = Field(
        default=1.0, gt=0, description="how often the gateway looks for tenant/key changes made by other "
                                       "processes (the CLI): a revocation there takes effect within this")
    tenants: tuple[TenantSeed, ...] = ()
    breaker: BreakerConfig = BreakerConfig()
    admission: AdmissionConfig = AdmissionConfig()
    alerts: AlertsConfig = AlertsConfig()
    shared: SharedStoresConfig | None = Field(
        default=None, description="a fleet replica: state in Redis, ledger and tenants in PostgreSQL "
                                  "(docs/gateway-ops.md, 'Running a fleet'); None: the embedded stores")


class GatewayConfigLike(Protocol):
    """The parts of the gateway's config token operations read."""

    @property
    def ops(self) -> Mapping[str, Any]: ...

    def price(self, model: str) -> PriceLike: ...


def ops_config(config: GatewayConfigLike) -> OpsConfig:
    """The validated ``ops`` section; ValueError with one line naming the bad field."""
    if isinstance(config.ops, OpsConfig):
        return config.ops
    try:
        return OpsConfig.model_validate(dict(config.ops))
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        raise ValueError(f"ops.{where}: {e['msg']}") from None


def open_tenant_store(config: GatewayConfigLike, db_url: str | None = None) -> TenantStore:
    """The tenant store ``build_guard`` would use, for the CLI (no reconciliation, no seeding)."""
    ops = ops_config(config)
    url = ops.db_url or db_url
    if url is None:
        raise ValueError("ops.db_url: no database for tenants")
    engine = sqlite_engine(url)
    return TenantStore(engine, server_secret=secret_of(ops, engine))


def secret_of(ops: OpsConfig, engine: Engine) -> bytes:
    """The HMAC secret for key digests: the configured one, else one kept in the database."""
    return ops.server_secret.encode() if ops.server_secret else stored_secret(engine)
