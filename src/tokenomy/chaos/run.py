"""One chaos (or soak) run end to end: start the fleet, drive the load while the fault schedule
runs, sample every replica's RSS, wait until every outbox drained and no hold is left, audit, stop
everything. :func:`run_chaos` returns the JSON ``benchmarks/chaos.py`` writes."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from tokenomy.chaos.audit import audit, holds_left, outbox_ids, read_budgets, read_ledger, scrape_counters
from tokenomy.chaos.faults import Injector, schedule
from tokenomy.chaos.load import Load
from tokenomy.chaos.report import (
    availability_by_window,
    error_codes,
    latency_drift,
    postgres_outage,
    rss_growth,
)
from tokenomy.chaos.stack import ChaosStack


@dataclass(frozen=True)
class ChaosOptions:
    """``duration_s`` of load (faults unless ``soak``), ``seed`` of the schedule and the workload;
    ``settle_timeout_s`` bounds the wait for outboxes and holds after the load. ``redis_appendonly``
    False: Redis loses its data at each restart (spend is then re-seeded from PostgreSQL, and budgeted
    keys wait for PostgreSQL when it is away too). ``on_client_disconnect``: the replicas' policy for
    a client hanging up mid-stream (``cancel``, the gateway's default, or ``finish``)."""

    duration_s: float = 600.0
    seed: int = 0
    soak: bool = False
    replicas: int = 3
    backends: int = 3
    time_scale: float = 0.05
    rss_every_s: float = 5.0
    settle_timeout_s: float = 240.0
    keep_dir: bool = False
    redis_appendonly: bool = True
    on_client_disconnect: str = "cancel"

    def __post_init__(self) -> None:
        if self.on_client_disconnect not in ("cancel", "finish"):
            raise ValueError(f"on_client_disconnect must be cancel or finish, got {self.on_client_disconnect!r}")
        if not (math.isfinite(self.duration_s) and self.duration_s >= 30):
            raise ValueError(f"duration must be at least 30 s, got {self.duration_s:g}")
        for name in ("replicas", "backends"):
            if not 1 <= getattr(self, name) <= 16:
                raise ValueError(f"{name} must be between 1 and 16, got {getattr(self, name)}")
        for name in ("time_scale", "rss_every_s", "settle_timeout_s"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def _outbox_depths(stack: ChaosStack) -> list[int | None]:
    depths: list[int | None] = []
    for r in stack.replicas:
        try:
            depths.append(int(httpx.get(r.url + "/health", timeout=5.0).json()["ledger_outbox"]["depth"]))
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            depths.append(None)
    return depths


async def _settle(stack: ChaosStack, timeout_s: float) -> dict[str, Any]:
    """Wait (polling, bounded) until every replica answers with an empty outbox and Redis holds no hold."""
    assert stack.redis is not None
    deadline = time.monotonic() + timeout_s
    t0 = time.monotonic()
    depths: list[int | None] = []
    holds = -1
    while time.monotonic() < deadline:
        depths = await asyncio.to_thread(_outbox_depths, stack)
        with contextlib.suppress(Exception):
            holds = await asyncio.to_thread(holds_left, stack.redis.url)
        if all(d == 0 for d in depths) and holds == 0:
            break
        await asyncio.sleep(0.5)
    return {"settle_s": round(time.monotonic() - t0, 1), "outbox_depths": depths, "holds_at_settle": holds}


async def run_chaos(opts: ChaosOptions, log: Any = print) -> dict[str, Any]:
    stack = ChaosStack(opts.replicas, opts.backends, opts.time_scale, keep=opts.keep_dir,
                       redis_appendonly=opts.redis_appendonly, on_client_disconnect=opts.on_client_disconnect)
    log(f"starting the fleet in {stack.workdir}")
    try:  # a start that fails half-way stops what it started
        await stack.start()
        return await _drive(stack, opts, log)
    finally:
        await stack.stop()


async def _drive(stack: ChaosStack, opts: ChaosOptions, log: Any) -> dict[str, Any]:
    assert stack.redis is not None
    faults = [] if opts.soak else schedule(opts.duration_s, opts.seed, opts.replicas, opts.backends)
    counters: dict[str, Counter[str]] = {e.instance_id: Counter() for e in stack.emulators}
    lost_reads: list[dict[str, Any]] = []  # pre-kill reads that failed: that life's tokens are not in counters

    async def on_backend_kill(i: int) -> None:
        e = stack.emulators[i]
        try:
            counters[e.instance_id].update(await asyncio.to_thread(scrape_counters, e.url))
        except (httpx.HTTPError, OSError) as exc:  # down already (a restart under way) or not answering
            lost_reads.append({"backend": e.instance_id, "at_s": round(time.perf_counter() - t0, 2),
                               "error": f"{type(exc).__name__}: {exc}"})

    t0 = time.perf_counter()
    load = Load([r.url for r in stack.replicas], stack.keys, opts.duration_s, f"run{opts.seed}-{int(time.time())}",
                t0, seed=opts.seed)
    injector = Injector(stack, t0, on_backend_kill, load.disconnects)
    samples: list[tuple[float, list[tuple[int, int] | None]]] = []

    async def sample_rss() -> None:
        while True:
            pids = [r.proc.pid if r.proc is not None else 0 for r in stack.replicas]
            samples.append((time.perf_counter() - t0, [None if rss is None else (pid, rss)
                                                       for pid, rss in zip(pids, stack.rss_bytes(), strict=True)]))
            await asyncio.sleep(opts.rss_every_s)

    log(f"load for {opts.duration_s:g} s, {len(faults)} faults (seed {opts.seed})")
    sampler = asyncio.ensure_future(sample_rss())
    try:
        await asyncio.gather(load.run(), injector.run(faults))
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    log("load done; waiting for the outboxes to drain and the holds to clear")
    settle = await _settle(stack, opts.settle_timeout_s)
    for e in stack.emulators:
        counters[e.instance_id].update(await asyncio.to_thread(scrape_counters, e.url))
    ledger = await asyncio.to_thread(read_ledger, stack.pg_direct_url)
    budgets = await asyncio.to_thread(read_budgets, stack.pg_direct_url)
    holds = await asyncio.to_thread(holds_left, stack.redis.url)
    found = audit(load.requests, ledger, budgets, {b: dict(c) for b, c in counters.items()}, holds, outbox_ids(stack.workdir))
    requests = [r for r in load.requests if not r.disconnected]
    warmup_s = 300.0 if opts.soak and opts.duration_s >= 1200 else 0.1 * opts.duration_s
    rss = rss_growth(samples, warmup_s, 0.3 * opts.duration_s)
    return {
        "duration_s": opts.duration_s, "seed": opts.seed, "soak": opts.soak, "redis_appendonly": opts.redis_appendonly,
        "on_client_disconnect": opts.on_client_disconnect,
        "faults": [a.to_dict() for a in sorted(injector.applied, key=lambda a: a.start_s)],
        "offered": len(requests), "served": sum(r.complete for r in requests),
        "hung_up": len(load.requests) - len(requests),
        "lost": found["lost"], "duplicated": found["duplicated"],
        "ledger_vs_backends_max_diff_tokens": found["ledger_vs_backends_max_diff_tokens"],
        "overspend_usd": found["overspend_usd"], "holds_left": found["holds_left"],
        "availability_by_window": availability_by_window(load.requests, injector.applied),
        "availability_postgres_outage": postgres_outage(load.requests, injector.applied),
        "rss_growth_pct": rss["max_pct"],
        "misrecorded": found["misrecorded"], "extra": found["extra"],
        "recorded_then_cut": found["recorded_then_cut"], "unmetered_cut": found["unmetered_cut"],
        "lost_counter_reads": lost_reads, "audit": found, "errors": error_codes(load.requests), "settle": settle, "failed_restarts": injector.restarts,
        "rss": {"warmup_s": warmup_s, **rss, "samples": [(round(t, 1), s) for t, s in samples]},
        "latency": latency_drift(requests, opts.duration_s, 300.0 if opts.duration_s >= 1200 else opts.duration_s / 6),
    }
