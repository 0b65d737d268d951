"""The live half of ``benchmarks/closed_loop.py``: ``run_bench`` (each session with its tenant's key)
-> ``tokenomy serve`` (the mode's admission policy and router) -> ``tokenomy up`` (emulated engines),
one such chain per cell of the fleet, the cells at once (each in its own process), under a lock."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from _live import emulator_health, live_cluster, metric_lines, run_health
from closed_loop_stats import figures, pool

from tokenomy.bench import BenchConfig, run_bench
from tokenomy.core import RequestRecord, Session
from tokenomy.gateway.ops.keys import new_api_key


def _gateway_counts(url: str) -> dict[str, dict[str, float]]:
    """Deferrals and refusals by tier from the gateway's ``/metrics`` (empty when it has none)."""
    out: dict[str, dict[str, float]] = {"deferred": {}, "refused": {}}
    for name, value in metric_lines(url):
        for kind in ("deferred", "refused"):
            prefix = f"tokenomy_gateway_admission_{kind}_total{{"
            if name.startswith(prefix) and 'tier="' in name:
                tier = name.split('tier="', 1)[1].split('"', 1)[0]
                out[kind][tier] = out[kind].get(tier, 0.0) + value
    return out


def _ledger_ttfts(db: Path) -> dict[str, float]:
    """Request id -> TTFT at the gateway (from its receipt of the request: admission wait, routing
    and the engine's TTFT) of every answered request in the gateway's SQLite ledger."""
    if not db.exists():
        return {}
    with closing(sqlite3.connect(db)) as con:
        rows = con.execute("SELECT request_id, ttft_s FROM usage_events WHERE ttft_s IS NOT NULL").fetchall()
    return {str(r): float(t) for r, t in rows}


def ttft_split(records: list[RequestRecord], gateway_ttft: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per tier, for turns answered at their first attempt: TTFT as the client saw it, as the gateway
    saw it, and the difference (the client's send, the HTTP hops and the relay of the first chunk),
    as P50 / P90 / P99."""
    by: dict[str, dict[str, list[float]]] = {}
    for r in records:
        g = gateway_ttft.get(r.request_id)
        if r.ttft_s is None or g is None:
            continue
        d = by.setdefault(r.tier, {"client": [], "gateway": [], "outside_gateway": []})
        d["client"].append(r.ttft_s)
        d["gateway"].append(g)
        d["outside_gateway"].append(r.ttft_s - g)
    return {t: {k: {f"p{q}": round(float(np.percentile(v, q)), 3) for q in (50, 90, 99)} | {"n": len(v)}
                for k, v in d.items()} for t, d in sorted(by.items())}


def live_mode(mode: str, spec: Any, sessions: list[Session], api: str = "completions") -> tuple[dict[str, Any], dict[str, Any]]:
    """``mode``'s figures live (``closed_loop.figures``) and the run's health (load average before
    and after, wall time, each emulator's busy and lag-dropped seconds, the gateway's counts, TTFT
    at the client and at the gateway, every request as ``[id, tier, arrival, TTFT, finish]``)."""
    keys = {t: new_api_key() for t in sorted({s.tenant for s in sessions})}
    with run_health() as health, live_cluster(
            spec.cluster_file(), lambda urls, blocks, port, tmp: spec.gateway_file(mode, urls, blocks, port, keys, tmp)
    ) as live:
        rep = run_bench(sessions, BenchConfig(targets=(live.url,), model=spec.model, api=api,
                                              slo=spec.slo, gpus=spec.instances, seed=spec.seed,
                                              tenant_keys=tuple(sorted(keys.items())), retry=spec.retry))
        health["gateway"] = _gateway_counts(live.url)
        gateway_ttft = _ledger_ttfts(live.tmp / "ledger.db")
        health["emulators"] = emulator_health([f"mixed-{i}" for i in range(len(live.instance_urls))],
                                              live.instance_urls)
    health["loadavg"] = [round(health["loadavg_before"][0], 2), round(health["loadavg_after"][0], 2)]
    health["errors_by_status"] = rep.errors_by_status
    health["error_examples"] = rep.extras.get("error_examples", {})
    health["retries"], health["abandoned_turns"] = rep.extras["retries"], rep.extras["abandoned_turns"]
    out = figures(rep.summary, rep.records, spec.slo, spec.goodput_window_s)
    health["ttft_split_by_tier"] = ttft_split(rep.records, gateway_ttft)
    health["records"] = [[r.request_id, r.tier, round(r.arrival_s, 3), None if r.ttft_s is None else round(r.ttft_s, 3),
                          None if r.finish_s is None else round(r.finish_s, 3)] for r in rep.records]
    if health["gateway"]["deferred"]:
        out["deferred_by_tier"] = {t: int(v) for t, v in health["gateway"]["deferred"].items()}
    return out, health



LOCK_TIMEOUT_S = 5400.0


@contextmanager
def held(lock: Path | None, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[float]:
    """Hold ``lock`` (an flock, as ``flock -w``: a blocking wait, so the kernel hands the lock over
    in turn and a polling waiter does not lose every race) for the block; yields the seconds waited."""
    if lock is None:
        yield 0.0
        return

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"{lock} not free after {timeout_s:.0f} s")

    t0 = time.monotonic()
    with open(lock, "a") as fh:
        previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(int(timeout_s))
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        try:
            yield time.monotonic() - t0
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def live_fleet(mode: str, cells: list[tuple[Any, list[Session]]], lock: Path | None,
               api: str = "completions") -> tuple[dict[str, Any], dict[str, Any]]:
    """``mode`` live on every cell at once (each cell's chain in its own process, so no client
    shares an interpreter), under ``lock``; the cells' figures pooled (``closed_loop_stats.pool``),
    the health of each cell and the load average before and after, inside the lock."""
    with held(lock) as waited:
        before, t0 = os.getloadavg(), time.monotonic()
        with ProcessPoolExecutor(len(cells), mp_context=multiprocessing.get_context("spawn")) as ex:
            done = list(ex.map(live_mode, [mode] * len(cells), [c for c, _ in cells], [s for _, s in cells],
                               [api] * len(cells)))
        after = os.getloadavg()
    health = {"lock_wait_s": round(waited, 1), "wall_s": round(time.monotonic() - t0, 1),
              "loadavg": [round(before[0], 2), round(after[0], 2)], "loadavg_before": before,
              "loadavg_after": after, "cells": [h for _, h in done],
              "lag_dropped_s": [e.get("lag_dropped_s") for _, h in done for e in h["emulators"].values()]}
    return pool([f for f, _ in done]), health
