"""Render time of each console page with 10,000 sessions in the ledger, next to 100.

A real guard (SQLite tenant store: 4 orgs x 2 teams x 3 keys, budgets on the orgs) and a real
SQLite ledger filled with ``--sessions`` agent sessions of ``--turns`` turns each, spread over the
last hour, behind the console app, signed in; each page fetched ``--repeat`` times in process
(Starlette's test client: no network, the server-side work only). The same run measures a ledger
of ``--small`` sessions so the ratio shows how a page scales.

    python benchmarks/console_pages.py --json out/console_pages.json

Writes ``{"<sessions>": {"events": n, "pages": {"<page>": {"median_ms", "p95_ms", "max_ms",
"cpu_median_ms"}}}, "ratio_median": {...}, "ratio_cpu_median": {"<page>": large / small}}``; CPU time
(this process, server and client) is steadier than wall time on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from tokenomy.gateway.console import ConsoleDeps, ConsoleQueries, build_console
from tokenomy.gateway.metering.ledger import UsageEvent
from tokenomy.gateway.ops.build import build_guard
from tokenomy.gateway.ops.tenancy import NodeKind, NodeLimits
from tokenomy.gateway.stores.ledger_sql import SqlLedger

ADMIN = "admin-bench-" + "x" * 20


@dataclass(frozen=True)
class _Price:
    input_per_mtok: float = 3.0
    cached_input_per_mtok: float = 0.3
    output_per_mtok: float = 15.0


@dataclass
class _Config:
    ops: dict[str, Any]

    def price(self, model: str) -> _Price:
        return _Price()


@dataclass
class _Pool:
    backends: list[Any] = field(default_factory=list)


def _fill(ledger: SqlLedger, keys: list[str], sessions: int, turns: int, now: float) -> int:
    batch: list[UsageEvent] = []
    n = 0
    for s in range(sessions):
        path = keys[s % len(keys)]
        start = now - 3600 + 3500 * s / sessions
        for t in range(turns):
            prompt = 2000 + 300 * t
            cached = 0 if t == 0 else 1800 + 300 * (t - 1)
            cost = ((prompt - cached) * 3 + cached * 0.3 + 200 * 15) / 1e6
            batch.append(UsageEvent(f"r{s}-{t}", start + 5 * t, path, path.rsplit("/", 1)[-1], "m", f"decode-{s % 4}",
                                    "chat", True, 200, "ok", f"session-{s}", t, prompt, prompt if t == 0 else 0,
                                    0 if t == 0 else 100, 0 if t == 0 else prompt - 100, 200, cached, prompt - cached,
                                    (prompt - cached) * 3e-6, cached * 0.3e-6, 200 * 15e-6, cost, cached * 2.7e-6,
                                    0.2, 0.02, 4.0))
            n += 1
        if len(batch) >= 5000:
            ledger.record_sync(batch)
            batch = []
    if batch:
        ledger.record_sync(batch)
    return n


def measure(sessions: int, turns: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        now = time.time()
        guard = build_guard(_Config({"server_secret": "bench-secret-0123456789", "admin_key": ADMIN}),
                            db_url=f"sqlite:///{tmp}/ops.db")
        keys = []
        for o in range(4):
            org = guard.store.create_node(NodeKind.ORG, f"org{o}", None, NodeLimits(budget_usd=1000.0))
            for t in range(2):
                team = guard.store.create_node(NodeKind.TEAM, f"team{t}", org.id)
                for k in range(3):
                    key, _ = guard.store.create_key(team.id, f"key{k}")
                    keys.append(f"{org.id}/{team.id}/{key.id}")
        ledger = SqlLedger(f"sqlite:///{tmp}/ledger.db")
        try:
            events = _fill(ledger, keys, sessions, turns, now)
            console = build_console(ConsoleDeps(guard, ConsoleQueries(ledger.engine), _Pool()))
            app = Starlette(routes=[Mount("/console", console)])
            with TestClient(app, base_url="http://testserver/console") as client:
                client.post("/login", data={"admin_key": ADMIN})
                pages = {"tenants": "/tenants", "spend 1h": "/spend?window=1h", "spend 24h": "/spend?window=24h",
                         "spend page 40": "/spend?window=1h&page=40", "session": "/session?key={k}&id=session-7",
                         "live": "/live", "cluster": "/cluster"}
                out: dict[str, Any] = {}
                for name, path in pages.items():
                    url = path.format(k=keys[7 % len(keys)].rsplit("/", 1)[-1])
                    times, cpu = [], []
                    for _ in range(repeat):
                        t0, c0 = time.perf_counter(), time.process_time()
                        r = client.get(url)
                        times.append((time.perf_counter() - t0) * 1e3)
                        cpu.append((time.process_time() - c0) * 1e3)
                        assert r.status_code == 200, (url, r.status_code)
                    times.sort()
                    out[name] = {"median_ms": round(statistics.median(times), 2),
                                 "p95_ms": round(times[int(0.95 * (len(times) - 1))], 2), "max_ms": round(times[-1], 2),
                                 "cpu_median_ms": round(statistics.median(cpu), 2)}
            return {"events": events, "pages": out}
        finally:
            ledger.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", default=None, metavar="OUT")
    args = ap.parse_args()
    result: dict[str, Any] = {}
    for n in (args.small, args.sessions):
        result[str(n)] = measure(n, args.turns, args.repeat)
        print(f"{n:>6} sessions ({result[str(n)]['events']} events)")
        for page, m in result[str(n)]["pages"].items():
            print(f"    {page:<14} median {m['median_ms']:8.2f} ms   p95 {m['p95_ms']:8.2f} ms   "
                  f"CPU median {m['cpu_median_ms']:8.2f} ms")
    small, large = result[str(args.small)]["pages"], result[str(args.sessions)]["pages"]
    result["ratio_median"] = {p: round(large[p]["median_ms"] / small[p]["median_ms"], 2) for p in large}
    result["ratio_cpu_median"] = {p: round(large[p]["cpu_median_ms"] / max(small[p]["cpu_median_ms"], 0.01), 2)
                                  for p in large}
    print("ratio (large / small, median wall):", result["ratio_median"])
    print("ratio (large / small, median CPU):", result["ratio_cpu_median"])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
