"""Cost of token operations per request: ``admit`` + ``settle`` of the real Guard, in process.

Every feature on: a seeded key under an org and a team, RPM/TPM limits and budgets on all three,
session breakers (turn cap, repetition, velocity, session budget); admission with a queue
configured (never full). Measured for both reservation stores side by side in one run:
``memory`` (in-process) and ``sql`` (holds persisted in SQLite, recoverable after a crash).

    python benchmarks/guard_overhead.py --requests 3000 --json out/guard_overhead.json

Writes ``{"memory": {"p50_us", "p99_us", "mean_us", "cpu_mean_us"}, "sql": {...}}`` (admit + settle
per request; ``cpu_mean_us`` is this process's CPU time per request, steadier than wall time on a
shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenomy.gateway.ops.build import build_guard
from tokenomy.gateway.ops.guard import AdmitRequest, SettledUsage
from tokenomy.gateway.ops.keys import new_api_key


@dataclass(frozen=True)
class _Price:
    input_per_mtok: float = 0.2
    cached_input_per_mtok: float = 0.05
    output_per_mtok: float = 0.6


@dataclass
class _Config:
    ops: dict[str, Any]

    def price(self, model: str) -> _Price:
        return _Price()


def _ops(key: str, reservations: str) -> dict[str, Any]:
    big = {"rpm": 10**9, "tpm": 10**12, "max_concurrent": 10**6, "budget_usd": 10**6}
    return {
        "server_secret": "b" * 32, "reservations": reservations,
        "breaker": {"max_turns_per_session": 10**9, "repeat_limit": 10**6, "session_tokens_per_min": 10**12,
                    "key_tokens_per_min": 10**12, "session_budget_usd": 10**6},
        "admission": {"max_in_flight": 10**6},
        "tenants": [{"org": "o", "limits": big, "teams": [{"name": "t", "limits": big, "keys": [
            {"name": "k", "key": key, "limits": big}]}]}],
    }


async def _run(guard: Any, key: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        adm = await guard.admit(AdmitRequest(f"r{i}", key, "m", 500, 200, session_id=f"s{i % 50}",
                                             prompt_fingerprint=str(i)))
        await guard.settle(adm, SettledUsage(500, 100, 256, 1e-4))
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per store")
    ap.add_argument("--json", default=None, metavar="OUT")
    args = ap.parse_args()
    key = new_api_key()
    with tempfile.TemporaryDirectory() as tmp:
        guards = {name: build_guard(_Config(_ops(key, name)), db_url=f"sqlite:///{Path(tmp) / name}.db")
                  for name in ("memory", "sql")}
        samples: dict[str, list[float]] = {name: [] for name in guards}
        cpu_s: dict[str, float] = dict.fromkeys(guards, 0.0)
        for guard in guards.values():
            asyncio.run(_run(guard, key, 200))  # warm up
        for _ in range(args.rounds):
            for name, guard in guards.items():
                c0 = time.process_time()
                samples[name] += asyncio.run(_run(guard, key, args.requests // args.rounds))
                cpu_s[name] += time.process_time() - c0
    result = {}
    for name, xs in samples.items():
        xs.sort()
        result[name] = {"p50_us": round(xs[len(xs) // 2], 1), "p99_us": round(xs[int(len(xs) * 0.99)], 1),
                        "mean_us": round(statistics.fmean(xs), 1), "requests": len(xs),
                        "cpu_mean_us": round(cpu_s[name] / len(xs) * 1e6, 1)}
        r = result[name]
        print(f"{name:6s} admit+settle: p50 {r['p50_us']:8.1f} us  p99 {r['p99_us']:8.1f} us  mean {r['mean_us']:8.1f} us"
              f"  CPU {r['cpu_mean_us']:7.1f} us/request  ({len(xs)} requests)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
