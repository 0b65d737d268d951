"""What shared state costs, and what it buys: the embedded gateway and a Redis + PostgreSQL fleet
replica side by side in one run, then the TPM one key gets through 1 and through 3 replicas.

The instant upstream of ``gateway_overhead.py`` runs in its own process; a local redis-server and
PostgreSQL cluster start here (``tokenomy.gateway.stores.servers``). Three gateways run as
``tokenomy serve``: the embedded default (memory + SQLite) and a fleet replica (``ops.shared``),
measured at concurrency 1 in alternating rounds with the upstream direct, so all see the same
machine state: added p50 latency and gateway CPU per request (user + system from /proc). Then 3
fleet replicas serve a key limited to ``--tpm`` tokens a minute: requests (13 tokens each, as the
upstream reports) are sent back to back, through one replica and, for a second key with the same
limit, round-robin through three, until the first 429; "TPM served" is the tokens served less what
the bucket refilled during the burst (``tpm`` / 60 a second) - equal within one request when the
limit is the fleet's, three times it when each replica counts alone.

    python benchmarks/gateway_fleet.py --json out/gateway_fleet.json

Writes ``{"embedded": {"p50_added_ms", "cpu_ms_per_request"}, "shared": {...}, "tpm_limit",
"tpm_served_1_replica", "tpm_served_3_replicas", "request_tokens"}`` (plus context fields).
Targets (issue 18): shared <= 2 ms p50 added and <= 0.5 ms more CPU per request than embedded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway_overhead import (
    API_KEY,
    MODEL,
    _call,
    _conn,
    _cpu_s,
    _free_port,
    _latencies,
    _pct,
    _wait_port,
    write_json,
)

from tokenomy.gateway.http.replicas import Replica, start_replicas, stop_all
from tokenomy.gateway.stores.servers import start_postgres, start_redis

REQUEST_TOKENS = 13  # the instant upstream's usage: 12 prompt + 1 completion
TPM_KEYS = {"tpm1": "tk-" + "c" * 43, "tpm3": "tk-" + "d" * 43}


def _config(tmp: Path, name: str, up_ports: list[int], shared: dict[str, Any] | None, tpm: int) -> Path:
    keys = [{"name": "k1", "key": API_KEY}]
    keys += [{"name": n, "key": k, "limits": {"tpm": tpm}} for n, k in TPM_KEYS.items()]
    ops: dict[str, Any] = {
        "server_secret": "bench-secret-0123456789", "admin_key": "bench-admin-0123456789",
        "tenants": [{"org": "bench", "limits": {"rpm": 10_000_000, "tpm": 10_000_000_000, "budget_usd": 1e9},
                     "teams": [{"name": "load", "keys": keys}]}],
    }
    if shared is not None:
        ops["shared"] = shared
    cfg = {"backends": [{"id": f"up{i}", "url": f"http://127.0.0.1:{p}"} for i, p in enumerate(up_ports)],
           "router": {"name": "session_affinity"}, "ledger": {"url": f"sqlite:///{tmp / (name + '.db')}"}, "ops": ops}
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return path


async def _side_by_side(direct: int, gateways: dict[str, Replica], n: int, rounds: int) -> dict[str, Any]:
    for r in gateways.values():
        await _latencies(r.port, True, 300)  # warm up
    await _latencies(direct, False, 200)
    lat: dict[str, list[float]] = {"direct": [], **{k: [] for k in gateways}}
    cpu: dict[str, float] = dict.fromkeys(gateways, 0.0)
    for _ in range(rounds):  # alternate so every path sees the same machine state
        lat["direct"] += await _latencies(direct, False, n // rounds)
        for name, r in gateways.items():
            assert r.proc is not None
            c0 = _cpu_s(r.proc.pid)
            lat[name] += await _latencies(r.port, True, n // rounds)
            cpu[name] += _cpu_s(r.proc.pid) - c0
    base = _pct(lat["direct"], 0.5)
    return {name: {"p50_added_ms": (_pct(lat[name], 0.5) - base) * 1e3,
                   "p99_added_ms": (_pct(lat[name], 0.99) - _pct(lat["direct"], 0.99)) * 1e3,
                   "cpu_ms_per_request": cpu[name] / len(lat[name]) * 1e3, "requests": len(lat[name])}
            for name in gateways}


async def _burst(ports: list[int], key: str, tpm: int, limit: int = 100_000) -> float:
    """Tokens served to ``key`` round-robin over ``ports`` until the first 429, less the refill."""
    conns = [await _conn(p) for p in ports]
    served = 0
    t0 = time.perf_counter()
    try:
        for i in range(limit):
            port, rw = ports[i % len(ports)], conns[i % len(ports)]
            body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "say ok"}]})
            raw = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json"
                   f"\r\nauthorization: Bearer {key}\r\ncontent-length: {len(body)}\r\n\r\n{body}").encode()
            status = await _call(rw, raw)
            if status == 429:
                return served - (time.perf_counter() - t0) * tpm / 60.0
            if status != 200:
                raise RuntimeError(f"port {port} answered {status}")
            served += REQUEST_TOKENS
    finally:
        for _, w in conns:
            w.close()
    raise RuntimeError("never limited")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the numbers here")
    ap.add_argument("--requests", type=int, default=1500, help="requests per gateway at concurrency 1")
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the paths")
    ap.add_argument("--tpm", type=int, default=13_000, help="the TPM limit of the two burst keys")
    args = ap.parse_args(argv)
    up_ports = [_free_port(), _free_port()]
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        upstream = subprocess.Popen([sys.executable, str(here / "gateway_overhead.py"), "--upstream",
                                     ",".join(map(str, up_ports))])
        redis = start_redis(tmp / "redis")
        pg = start_postgres()
        replicas: list[Replica] = []
        try:
            for p in up_ports:
                _wait_port(p, upstream)
            shared = {"redis_url": redis.url, "postgres_url": pg.url, "outbox_dir": str(tmp)}
            emb = start_replicas(_config(tmp, "embedded", up_ports, None, args.tpm), [_free_port()], tmp)
            replicas += emb
            fleet = start_replicas(_config(tmp, "shared", up_ports, shared, args.tpm),
                                   [_free_port() for _ in range(3)], tmp)
            replicas += fleet
            import uvloop

            result: dict[str, Any] = uvloop.run(_side_by_side(up_ports[0], {"embedded": emb[0], "shared": fleet[0]},
                                                              args.requests, args.rounds))
            one = uvloop.run(_burst([fleet[0].port], TPM_KEYS["tpm1"], args.tpm))
            three = uvloop.run(_burst([r.port for r in fleet], TPM_KEYS["tpm3"], args.tpm))
        finally:
            stop_all(replicas)
            upstream.terminate()
            upstream.wait(15)
            redis.kill()
            pg.stop()
    result.update({"tpm_limit": args.tpm, "tpm_served_1_replica": round(one), "tpm_served_3_replicas": round(three),
                   "request_tokens": REQUEST_TOKENS, "load_avg_1m": os.getloadavg()[0]})
    print(json.dumps(result, indent=2))
    write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
