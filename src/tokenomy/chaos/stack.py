"""The fleet a chaos run works on, all on loopback: one Redis, one PostgreSQL, ``backends`` emulated
engines and ``replicas`` gateway replicas, with a :class:`LatencyProxy` in front of PostgreSQL and
of each engine (the slow-database and slow-backend faults act there).

Every process is a child of the harness and keeps its port across a kill and a restart, so the
gateway's configuration never changes. Keys come in tiers (:data:`TIERS`): ``open`` has no budget
(it stays available on its own in an outage), ``budgeted`` a budget it never reaches, ``capped``
a budget the run spends (a budget node that must never be overspent); all have rate limits and
the key-level token breaker on.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tokenomy.chaos.proxy import LatencyProxy
from tokenomy.emulator.launcher import parent_death_signal
from tokenomy.gateway.http.replicas import Replica, start_replicas, stop_all
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.stores.servers import (
    PostgresServer,
    RedisServer,
    free_port,
    start_postgres,
    start_redis,
)

MODEL = "llama-3.1-8b"
PRICE = {"input_per_mtok": 1.0, "cached_input_per_mtok": 0.5, "output_per_mtok": 4.0}
TIERS: dict[str, dict[str, Any]] = {
    "open": {"rpm": 6000, "tpm": 50_000_000},
    "budgeted": {"rpm": 6000, "tpm": 50_000_000, "budget_usd": 1000.0},
    "capped": {"rpm": 6000, "budget_usd": 0.05},
}
"""Limits of each key tier (``capped``'s budget is spent within a minute of load)."""


@dataclass
class Emulator:
    """One ``python -m tokenomy.emulator`` on a fixed port; ``kill`` is a SIGKILL, ``start`` again."""

    instance_id: str
    port: int
    log: Path
    time_scale: float
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Emulator:
        argv = [sys.executable, "-m", "tokenomy.emulator", "--port", str(self.port), "--instance-id",
                self.instance_id, "--model", MODEL, "--time-scale", str(self.time_scale), "--log-level", "warning"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=parent_death_signal())  # call from the loop's thread
        return self

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"emulator {self.instance_id} exited; see {self.log}")
            with contextlib.suppress(urllib.error.URLError, OSError), \
                    urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"emulator {self.instance_id} not ready within {timeout_s:.0f} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class ChaosStack:
    """Start with :meth:`start` inside the running event loop (the proxies live there); always
    :meth:`stop`. ``keys`` maps a tier to its raw API key."""

    replicas_n: int = 3
    backends_n: int = 3
    time_scale: float = 0.05
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tokenomy-chaos-")))
    redis: RedisServer | None = None
    pg: PostgresServer | None = None
    pg_proxy: LatencyProxy | None = None
    emulators: list[Emulator] = field(default_factory=list)
    backend_proxies: list[LatencyProxy] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)
    config_path: Path | None = None
    keep: bool = False  # keep ``workdir`` (logs, outboxes) after ``stop``
    redis_appendonly: bool = True  # a Redis restart keeps its data (as docs/gateway-ops.md advises); False: loses it
    on_client_disconnect: str = "cancel"  # the replicas' server.on_client_disconnect

    async def start(self) -> ChaosStack:
        self.redis = await asyncio.to_thread(start_redis, self.workdir / "redis", None, self.redis_appendonly)
        self.pg = await asyncio.to_thread(start_postgres)
        self.pg_proxy = await LatencyProxy(self.pg.port).start()
        self.emulators = [Emulator(f"e{i}", free_port(), self.workdir / f"emulator-{i}.log", self.time_scale).start()
                          for i in range(self.backends_n)]
        for e in self.emulators:
            await asyncio.to_thread(e.wait_ready)
            self.backend_proxies.append(await LatencyProxy(e.port).start())
        self.keys = {tier: new_api_key() for tier in TIERS}
        self.config_path = self.workdir / "gateway.yaml"
        self.config_path.write_text(yaml.safe_dump(self.gateway_config()))
        ports = [free_port() for _ in range(self.replicas_n)]
        self.replicas = await asyncio.to_thread(start_replicas, self.config_path, ports, self.workdir)
        return self

    def gateway_config(self) -> dict[str, Any]:
        assert self.redis is not None and self.pg is not None and self.pg_proxy is not None
        pg_url = self.pg.url.replace(f":{self.pg.port}/", f":{self.pg_proxy.port}/")
        def keys(tiers: list[str]) -> list[dict[str, Any]]:
            return [{"name": t, "key": self.keys[t], "limits": TIERS[t]} for t in tiers]

        return {
            "backends": [{"id": e.instance_id, "url": f"http://127.0.0.1:{p.port}", "models": [MODEL]}
                         for e, p in zip(self.emulators, self.backend_proxies, strict=True)],
            "router": {"name": "session_affinity"},
            "server": {"on_client_disconnect": self.on_client_disconnect},
            "prices": {MODEL: PRICE},
            "ops": {"server_secret": "chaos-secret-" + "c" * 20,
                    "breaker": {"key_tokens_per_min": 50_000_000, "max_turns_per_session": 200},
                    "shared": {"redis_url": self.redis.url, "postgres_url": pg_url, "lease_s": 6.0,
                               "timeout_s": 2.0, "outbox_dir": str(self.workdir)},
                    # ``open`` has no budget on its whole path (an unbudgeted key); the others share an org budget
                    "tenants": [{"org": "lab", "teams": [{"name": "agents", "keys": keys(["open"])}]},
                                {"org": "paid", "limits": {"budget_usd": 5000.0},
                                 "teams": [{"name": "agents", "keys": keys(["budgeted", "capped"])}]}]},
        }

    @property
    def pg_direct_url(self) -> str:
        """PostgreSQL without the proxy (the audit's reads)."""
        assert self.pg is not None
        return self.pg.url

    def rss_bytes(self) -> list[int | None]:
        """Each replica's resident set size now (None: not running)."""
        out: list[int | None] = []
        for r in self.replicas:
            rss = None
            if r.proc is not None and r.proc.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    for line in Path(f"/proc/{r.proc.pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            rss = int(line.split()[1]) * 1024
            out.append(rss)
        return out

    async def stop(self) -> None:
        def stop_processes() -> None:
            stop_all(self.replicas)
            for e in self.emulators:
                with contextlib.suppress(Exception):
                    e.stop()
            if self.redis is not None:
                self.redis.kill()
            if self.pg is not None:
                self.pg.stop(remove=True)

        await asyncio.to_thread(stop_processes)
        for p in [self.pg_proxy, *self.backend_proxies]:
            if p is not None:
                await p.stop()
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
