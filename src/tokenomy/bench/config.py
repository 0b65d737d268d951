"""Typed configuration of one bench run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tokenomy.core import SLO
from tokenomy.policy.closedloop.retry import RetryPolicy

APIS = ("chat", "completions", "messages", "responses")
"""What a run speaks: OpenAI chat or completions, Anthropic Messages, OpenAI Responses (bench/bodies.py)."""


def normalize_target(url: str) -> str:
    """``http://host:port``, ``http://host:port/`` and ``http://host:port/v1`` all give the base
    URL without the ``/v1`` suffix; anything not starting with http:// or https:// is refused."""
    base = url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")) or len(base.split("://", 1)[1]) == 0:
        raise ValueError(f"--target must be an http:// or https:// URL, got {url!r}")
    return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True)
class BenchConfig:
    """What to send and how hard.

    Exactly one arrival mode: ``concurrency`` set (that many sessions in flight, the next one
    starting as soon as one ends) or None (sessions start at their workload ``start_s``, the
    workload's arrival process at ``--rate``). ``duration_s`` in concurrency mode stops new turns
    from being sent after that many seconds (requests in flight finish); in rate mode it bounds
    the arrivals, as in ``tokenomy sim``. ``request_timeout_s`` bounds one whole streamed
    request. ``ignore_eos`` sends vLLM's ``ignore_eos`` so the answer has exactly ``max_tokens``
    tokens (the workload's output length); turn it off for endpoints that reject the field.
    ``gpus`` and ``usd_per_gpu_hour`` only feed the cost rows (the bench cannot see the hardware).
    ``tenant_keys`` maps a session's tenant to the API key its requests carry (``--tenant-keys``);
    a tenant not in it sends ``api_key``. ``retry``: how a refused request (429, 503) is sent
    again (``--max-retries``; default the OpenAI SDK's: 2 retries after the ``retry-after`` given).
    ``tool_calls`` (Messages and Responses): an earlier answer followed by new input is re-sent as a
    tool call and that input as its result (agent workloads; :mod:`tokenomy.bench.bodies`).
    """

    targets: tuple[str, ...]
    model: str
    api: str = "chat"
    api_key: str | None = None
    concurrency: int | None = None
    duration_s: float = 120.0
    request_timeout_s: float = 600.0
    max_connections: int = 1024
    ignore_eos: bool = True
    slo: SLO = field(default_factory=SLO)
    gpus: int = 1
    usd_per_gpu_hour: float = 0.0
    seed: int = 0
    tenant_keys: tuple[tuple[str, str], ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    tool_calls: bool = True

    def key_of(self, tenant: str) -> str | None:
        """The API key requests of ``tenant`` carry."""
        return dict(self.tenant_keys).get(tenant, self.api_key)

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("--target: give at least one URL")
        object.__setattr__(self, "targets", tuple(normalize_target(t) for t in self.targets))
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if not self.model:
            raise ValueError("--model must not be empty")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {self.concurrency}")
        for name in ("duration_s", "request_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)) and not (name == "duration_s" and value == math.inf):
                raise ValueError(f"{name} must be positive, got {value}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.gpus < 1:
            raise ValueError(f"--gpus must be >= 1, got {self.gpus}")
        if any(not t or not k for t, k in self.tenant_keys):
            raise ValueError("--tenant-keys: every tenant needs a non-empty name and key")
        if not (self.usd_per_gpu_hour >= 0 and math.isfinite(self.usd_per_gpu_hour)):
            raise ValueError(f"--usd-per-gpu-hour must be >= 0, got {self.usd_per_gpu_hour}")
