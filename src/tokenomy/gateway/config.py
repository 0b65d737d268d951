"""The gateway's configuration: one pydantic model, loaded from YAML, validated before anything starts.

``GatewayConfig()`` with no arguments is the documented default: it fronts ``tokenomy up``'s default
cluster (4 mixed emulator instances on http://127.0.0.1:8100-8103 serving ``llama-3.1-8b``),
routes with ``session_affinity`` and writes its ledger to ``tokenomy-ledger.db`` (SQLite, WAL) in
the working directory.

Token operations (tenancy, limits, budgets, breakers, admission, alerts) keep their own section,
``ops``; its schema belongs to :mod:`tokenomy.gateway.ops.ops_guard` when that module exists, and is passed
through as a mapping otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tokenomy.gateway.ops.config import OpsConfig
from tokenomy.gateway.routing.aliases import ModelAlias
from tokenomy.gateway.routing.config import RoutingConfig

DEFAULT_MODEL = "llama-3.1-8b"  # what `tokenomy up` serves by default


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsConfig(_Strict):
    """TLS to an https backend: verification on by default; a private CA; a client certificate."""

    verify: bool = True
    ca_bundle: str | None = None  # PEM file of the CAs to trust instead of the system's
    client_cert: str | None = None  # PEM certificate (chain) presented to the backend
    client_key: str | None = None  # its private key, when not in client_cert's file

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("client_key needs client_cert")
        return self


class BackendConfig(_Strict):
    """One OpenAI-compatible server (our emulator, vLLM, SGLang)."""

    id: str = Field(min_length=1)
    url: str = Field(pattern=r"^https?://")
    models: tuple[str, ...] = (DEFAULT_MODEL,)
    block_size_tokens: int = Field(default=16, ge=1)
    total_blocks: int = Field(default=10_000, ge=1)  # labelled default: only scales kv_usage into blocks for routers
    api_key: str | None = None  # sent to the backend as a bearer token, when it needs one
    role: Literal["mixed", "prefill", "decode"] = "mixed"  # P/D pools of routing.mode disagg/ampd
    tls: TlsConfig | None = None  # https:// backends only
    max_connections: int | None = Field(default=None, ge=1)  # default: server.max_connections_per_backend
    # The protocols it serves natively; the others reach it translated to chat (docs/agents.md).
    # vLLM (>= 0.11) and our emulator serve all four.
    protocols: tuple[Literal["chat", "completions", "messages", "responses"], ...] = (
        "chat", "completions", "messages", "responses")

    @field_validator("url")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        return v.rstrip("/")

    @model_validator(mode="after")
    def _tls_needs_https(self) -> BackendConfig:
        if self.tls is not None and not self.url.startswith("https://"):
            raise ValueError(f"backend {self.id}: tls is set but the url is not https://")
        return self


class HealthConfig(_Strict):
    """Health checks (``GET /health``) and ``/metrics`` scraping; backoff for failed backends."""

    interval_s: float = Field(default=1.0, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    scrape_metrics: bool = True
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)


class RouterConfig(_Strict):
    """A router registered in :data:`tokenomy.policy.router.ROUTERS`, by name, with its options."""

    name: str = "session_affinity"
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> RouterConfig:
        from tokenomy.policy.router import make_router

        make_router(self.name, **self.options)  # raises ValueError naming the known routers
        return self


class Price(_Strict):
    """USD per million tokens. Cache hits are priced apart from recomputed prompt tokens."""

    input_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    reasoning_per_mtok: float | None = Field(default=None, ge=0)  # None: reasoning is output, at its price


# Labelled default: a hosted-API-like price shape for an 8B model, not a published figure.
DEFAULT_PRICE = Price(input_per_mtok=0.20, cached_input_per_mtok=0.05, output_per_mtok=0.60)


class LedgerConfig(_Strict):
    """Where usage events go. ``url`` is an SQLAlchemy URL; SQLite files run in WAL mode.

    ``synchronous`` is SQLite's: ``NORMAL`` survives a process crash (SIGKILL) with every
    acknowledged event; ``FULL`` also survives power loss, at an fsync per group commit.
    """

    url: str = "sqlite:///tokenomy-ledger.db"
    synchronous: str = Field(default="NORMAL", pattern=r"^(NORMAL|FULL)$")
    max_batch: int = Field(default=256, ge=1)  # the thread writer's largest group
    writer: str = Field(default="auto", pattern=r"^(auto|inline|thread)$")  # auto: inline for SQLite


class TimeoutsConfig(_Strict):
    """Seconds per phase. Client side: ``body_read_s`` bounds reading a request body (408 after);
    uvicorn's ``keep_alive_s`` closes idle client connections. Backend side: ``connect_s`` (TCP
    and TLS handshake, and the wait for a free connection when a backend's cap is reached),
    ``headers_s`` (request sent -> status and headers: a long prefill counts here),
    ``chunk_gap_s`` (between two pieces of a body: a stream may last long if it keeps moving)."""

    body_read_s: float = Field(default=30.0, gt=0)
    keep_alive_s: int = Field(default=5, ge=1)
    connect_s: float = Field(default=5.0, gt=0)
    headers_s: float = Field(default=600.0, gt=0)
    chunk_gap_s: float = Field(default=600.0, gt=0)


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    timeouts: TimeoutsConfig = TimeoutsConfig()
    # Labelled default: client connections served at once; past it uvicorn answers 503 at once.
    limit_concurrency: int | None = Field(default=4096, ge=1)
    max_connections_per_backend: int = Field(default=256, ge=1)  # open connections (idle or busy)
    upstream_client: Literal["fast", "aiohttp"] = "fast"  # benchmarks/gateway_overhead.py --clients
    retries: int = Field(default=2, ge=0, le=10)  # other backends tried after a connection error
    # Labelled default: sent as max_tokens when a request has none, so reservations have a bound.
    default_max_tokens: int = Field(default=4096, ge=1)
    # Labelled default (Llama-3.1's 128k): a model's context window when ``context_windows`` names
    # none; a max_tokens above it is refused (400) before anything is reserved for it.
    default_context_window_tokens: int = Field(default=131_072, ge=1)
    # A client hanging up mid-stream: ``cancel`` stops the backend (bills what was read from it);
    # ``finish`` reads the answer to its end and bills the backend's usage (docs/gateway.md).
    on_client_disconnect: Literal["cancel", "finish"] = "cancel"


class GatewayConfig(_Strict):
    """Everything ``tokenomy serve`` needs. See docs/gateway.md for each field."""

    server: ServerConfig = ServerConfig()
    backends: tuple[BackendConfig, ...] = tuple(
        BackendConfig(id=f"emu-{i}", url=f"http://127.0.0.1:{8100 + i}") for i in range(4)
    )
    router: RouterConfig = RouterConfig()
    routing: RoutingConfig = RoutingConfig()
    health: HealthConfig = HealthConfig()
    ledger: LedgerConfig = LedgerConfig()
    prices: dict[str, Price] = Field(default_factory=dict)
    context_windows: dict[str, int] = Field(default_factory=dict)  # model -> tokens (vLLM's max_model_len)
    default_price: Price = DEFAULT_PRICE
    aliases: tuple[ModelAlias, ...] = ()  # requested model names -> served models (docs/agents.md)
    ops: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_ids(self) -> GatewayConfig:
        if not self.backends:
            raise ValueError("backends: at least one backend is needed")
        ids = [b.id for b in self.backends]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"backends: duplicate id {dup[0]!r}")
        roles = {b.role for b in self.backends}
        if self.routing.mode != "colocated" and "decode" not in roles:
            raise ValueError(f"routing.mode {self.routing.mode}: needs backends with role: decode")
        if self.routing.mode == "disagg" and "prefill" not in roles:
            raise ValueError("routing.mode disagg: needs backends with role: prefill")
        served = set(self.models())
        for a in self.aliases:
            if a.model not in served:
                raise ValueError(f"aliases: {a.match!r} maps to {a.model!r}, which no backend serves")
        return self

    def native(self, model: str, protocol: str) -> bool:
        """Whether every backend serving ``model`` serves ``protocol`` itself (else it is translated)."""
        return all(protocol in b.protocols for b in self.backends if model in b.models)

    def price(self, model: str) -> Price:
        return self.prices.get(model, self.default_price)

    def context_window_tokens(self, model: str) -> int:
        return self.context_windows.get(model, self.server.default_context_window_tokens)

    def models(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for b in self.backends:
            for m in b.models:
                seen.setdefault(m, None)
        return tuple(seen)


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {err['msg']}{more}"


def config_from_dict(data: dict[str, Any], source: str = "config") -> GatewayConfig:
    """Validate a mapping; ValueError with one line naming the source and the bad field.

    The ``ops`` section is checked against token operations' schema (:class:`OpsConfig`).
    """
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{source}: {_one_line(exc)}") from None
    try:
        OpsConfig.model_validate(dict(config.ops))
    except ValidationError as exc:
        raise ValueError(f"{source}: ops.{_one_line(exc)}") from None
    return config


def load_config(path: str | Path | None) -> GatewayConfig:
    """The config in ``path`` (YAML), or the documented default when ``path`` is None."""
    if path is None:
        return GatewayConfig()
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--config {p}: no such file")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"--config {p}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {p}: the top level must be a mapping")
    return config_from_dict(data, source=str(p))
