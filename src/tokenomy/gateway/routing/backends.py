"""Backends: live state of each upstream server, seen by routers as an ``InstanceView``.

A :class:`Backend` combines two sources, each with one owner:

* the backend's own ``/metrics`` (vLLM names: ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` or the older
  ``vllm:gpu_cache_usage_perc``), scraped by :class:`BackendPool`'s health loop;
* the gateway's own counts, changed only by :meth:`Backend.dispatched`, :meth:`Backend.first_token`
  and :meth:`Backend.finished` (requests in flight, prompt tokens not yet prefilled, and which
  conversation prefixes it last served, for ``cached_prefix_tokens``);
* in a fleet, the other replicas' requests in flight there, as they last published them
  (``others_in_flight``, owned by :class:`tokenomy.gateway.routing.fleet_load.FleetLoad`).

Health: ``GET /health`` every ``interval_s``; a failed check or a connection error takes the
backend out, and it is tried again after a backoff that doubles per failure (``backoff_initial_s``
up to ``backoff_max_s``). A success puts it back.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable

import httpx

from tokenomy.core import Role, Segment
from tokenomy.gateway.config import BackendConfig, HealthConfig
from tokenomy.gateway.routing.periodic import Periodic

log = logging.getLogger(__name__)

_PREFIX_MEMORY = 10_000  # conversation prefixes remembered per backend (LRU)


class Backend:
    """One upstream server; satisfies :class:`tokenomy.policy.view.InstanceView`."""

    role = Role.MIXED

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        self.instance_id = config.id
        self.role = Role(config.role)
        self.url = config.url
        self.models = frozenset(config.models)
        self.block_size_tokens = config.block_size_tokens
        self.total_blocks = config.total_blocks
        # health (owned by BackendPool)
        self.healthy = True
        self.failures = 0
        self.retry_at_s = 0.0
        self.down_reason = ""  # why it was last taken out
        self.tls_failed = False  # ... and whether that was a TLS handshake failure
        # scraped from /metrics (owned by BackendPool)
        self.scraped_running = 0
        self.scraped_waiting = 0
        self.kv_usage = 0.0
        # the gateway's own counts (owned by the dispatch methods below)
        self.own_in_flight = 0  # forwarded by this process
        self.others_in_flight = 0  # forwarded by the fleet's other replicas (0 when embedded)
        self._prefilling: dict[str, int] = {}  # request id -> prompt tokens before its first token
        self._decoding: dict[str, int] = {}  # request id -> prompt tokens, after its first token
        self._prefixes: OrderedDict[int, int] = OrderedDict()  # stream key -> tokens held
        # Called with a request id when one of its requests gets its first token or leaves, and
        # with None after a scrape (AMPD's decode admission gate pumps on it).
        self.on_progress: Callable[[str | None], None] | None = None

    @property
    def in_flight(self) -> int:
        """Requests in flight here, from every replica of the fleet (this process's alone when embedded)."""
        return self.own_in_flight + self.others_in_flight

    # -- InstanceView ------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return max(self.scraped_running, self.in_flight - self.scraped_waiting, 0)

    @property
    def num_waiting(self) -> int:
        return self.scraped_waiting

    @property
    def num_waiting_tokens(self) -> int:
        return sum(self._prefilling.values())

    @property
    def num_decoding(self) -> int:
        return max(0, self.in_flight - len(self._prefilling))

    @property
    def decode_context_tokens(self) -> int:
        """Prompt tokens of the streams past their first token (what the gateway sent; their
        answers so far are not counted): AMPD's local ITL estimate prices decode steps by it."""
        return sum(self._decoding.values())

    @property
    def free_blocks(self) -> int:
        return int(round(self.total_blocks * (1.0 - min(1.0, max(0.0, self.kv_usage)))))

    def cached_prefix_tokens(self, content: tuple[Segment, ...], prompt_tokens: int) -> int:
        if not content:
            return 0
        key, _ = content[0]
        return min(self._prefixes.get(key, 0), prompt_tokens)

    # -- the gateway's own counts ----------------------------------------------------------
    def dispatched(self, request_id: str, prompt_tokens: int) -> None:
        self.own_in_flight += 1
        self._prefilling[request_id] = prompt_tokens

    def first_token(self, request_id: str) -> None:
        prompt = self._prefilling.pop(request_id, None)
        if prompt is not None:
            self._decoding[request_id] = prompt
        if self.on_progress is not None:
            self.on_progress(request_id)

    def finished(self, request_id: str, stream_key: int | None, context_tokens: int) -> None:
        """The request left this backend; ``context_tokens`` of ``stream_key`` are now cached there."""
        self._prefilling.pop(request_id, None)
        self._decoding.pop(request_id, None)
        self.own_in_flight = max(0, self.own_in_flight - 1)
        if stream_key is not None and context_tokens > 0:
            self._prefixes[stream_key] = context_tokens
            self._prefixes.move_to_end(stream_key)
            while len(self._prefixes) > _PREFIX_MEMORY:
                self._prefixes.popitem(last=False)
        if self.on_progress is not None:
            self.on_progress(request_id)


def parse_samples(text: str) -> dict[str, list[float]]:
    """Each metric's samples, one per label set (``name{...} value`` lines; comments skipped)."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            rest = line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        out.setdefault(name, []).append(value)
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum of each metric's samples over its label sets: right for counts only (a usage fraction
    per engine must not be summed: :meth:`BackendPool.apply_metrics` reads samples)."""
    return {name: sum(values) for name, values in parse_samples(text).items()}


def _is_tls(exc: BaseException) -> bool:
    """Whether ``exc`` or what caused it is a TLS error (httpx wraps ``ssl.SSLError``)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class BackendPool:
    """All backends, their health loop, and the shared pooled HTTP client."""

    def __init__(self, configs: tuple[BackendConfig, ...], health: HealthConfig, client: httpx.AsyncClient,
                 tls_clients: dict[str, httpx.AsyncClient] | None = None):
        self.backends = [Backend(c) for c in configs]
        self.by_id = {b.instance_id: b for b in self.backends}
        self.health = health
        self.client = client
        self.tls_clients = tls_clients or {}  # backend id -> a client with that backend's TLS context
        self._health_loop = Periodic("health loop", self.check_all, health.interval_s)

    def candidates(self, model: str, now_s: float, exclude: frozenset[str] = frozenset()) -> list[Backend]:
        """Healthy backends serving ``model``; when none is healthy, those whose backoff has passed."""
        serving = [b for b in self.backends if model in b.models and b.instance_id not in exclude]
        healthy = [b for b in serving if b.healthy]
        return healthy or [b for b in serving if b.retry_at_s <= now_s]

    def mark_down(self, b: Backend, now_s: float, why: str, tls: bool = False) -> None:
        b.failures += 1
        b.down_reason, b.tls_failed = why, tls
        delay = min(self.health.backoff_max_s, self.health.backoff_initial_s * 2 ** (b.failures - 1))
        b.retry_at_s = now_s + delay
        if b.healthy:
            log.warning("backend %s out (%s); retry in %.1fs", b.instance_id, why, delay)
        b.healthy = False

    def mark_up(self, b: Backend) -> None:
        if not b.healthy:
            log.info("backend %s back", b.instance_id)
        b.healthy = True
        b.failures = 0

    async def check(self, b: Backend) -> None:
        """One health check (and scrape) of ``b``."""
        timeout = self.health.timeout_s
        client = self.tls_clients.get(b.instance_id, self.client)
        try:
            r = await client.get(f"{b.url}/health", timeout=timeout)
            if r.status_code != 200:
                self.mark_down(b, time.monotonic(), f"/health {r.status_code}")
                return
            if self.health.scrape_metrics:
                m = await client.get(f"{b.url}/metrics", timeout=timeout)
                if m.status_code == 200:
                    self.apply_metrics(b, parse_samples(m.text))
        except httpx.HTTPError as exc:
            self.mark_down(b, time.monotonic(), f"{type(exc).__name__}: {exc}", tls=_is_tls(exc))
            return
        self.mark_up(b)

    @staticmethod
    def apply_metrics(b: Backend, samples: dict[str, list[float]]) -> None:
        """Read a scrape, one sample per label set: a data-parallel vLLM exports one series per
        engine (``engine="0"``, ``engine="1"``…). Counts (running, waiting) add up over engines;
        the KV usage fraction is their mean (engines of one server have equal KV pools, so the
        mean is the server's used fraction; a sum would pass 1 and make it look full)."""
        b.scraped_running = int(sum(samples.get("vllm:num_requests_running", ())))
        b.scraped_waiting = int(sum(samples.get("vllm:num_requests_waiting", ())))
        kv = samples.get("vllm:kv_cache_usage_perc") or samples.get("vllm:gpu_cache_usage_perc") or [0.0]
        b.kv_usage = sum(kv) / len(kv)
        if b.on_progress is not None:
            b.on_progress(None)

    async def check_all(self) -> None:
        now = time.monotonic()
        due = [b for b in self.backends if b.healthy or b.retry_at_s <= now]
        await asyncio.gather(*(self.check(b) for b in due))

    def start(self) -> None:
        self._health_loop.start()

    async def stop(self) -> None:
        await self._health_loop.stop()
