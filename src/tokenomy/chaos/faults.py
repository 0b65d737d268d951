"""The seeded fault schedule of a chaos run, and what each fault does to the fleet.

:func:`schedule` places every kind of :data:`KINDS` twice: once alone (one after another, with a
quiet gap between) in the first part of the run, then once more at seeded random times in the
second part, where they overlap. Durations are those of a 10-minute run scaled to the run's
length, never below a floor that still lets the fault bite (a PostgreSQL outage of 60 s in a
10-minute run, 8 s at least). The last part of the run has no fault, so every queue drains
before the audit.

:class:`Injector` applies a fault (inject, wait, recover) to a :class:`~tokenomy.chaos.stack.ChaosStack`
and records when it was in force: from injection until recovery finished (a restarted process
answering again), the window the availability is read over. An engine is killed with its proxy
paused: its counters are read, then it dies, so every token a replica got from it was counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from tokenomy.chaos.stack import ChaosStack

KINDS = ("replica_kill", "backend_kill", "redis_restart", "postgres_stop", "postgres_slow", "backend_slow",
         "client_disconnect")
BASE_DURATION_S = {"replica_kill": 5.0, "backend_kill": 5.0, "redis_restart": 3.0, "postgres_stop": 60.0,
                   "postgres_slow": 40.0, "backend_slow": 30.0, "client_disconnect": 20.0}
"""How long each fault lasts in a 10-minute run (a killed process stays down this long)."""
MIN_DURATION_S = {"replica_kill": 2.0, "backend_kill": 2.0, "redis_restart": 1.0, "postgres_stop": 8.0,
                  "postgres_slow": 6.0, "backend_slow": 5.0, "client_disconnect": 4.0}
SLOW_POSTGRES_S = 0.4
"""One-way latency of the slow PostgreSQL: a commit (several round trips) outlasts the ledger's 1 s."""
SLOW_BACKEND_S = 0.5
RESTART_BACKOFF_S = 2.0
RESTART_TIMEOUT_S = 300.0
"""One-way latency of the slow backend."""


@dataclass(frozen=True)
class Fault:
    kind: str
    start_s: float  # since the run's start
    duration_s: float
    target: int = 0  # which replica or backend (kinds that have one)
    overlapping: bool = False


def schedule(duration_s: float, seed: int, replicas: int = 3, backends: int = 3) -> list[Fault]:
    """Every kind alone, then every kind again overlapping (see the module docstring); sorted by start."""
    if duration_s < 30:
        raise ValueError(f"a chaos run needs at least 30 s, got {duration_s:g}")
    rng = random.Random(seed)
    scale = duration_s / 600.0
    dur = {k: max(MIN_DURATION_S[k], BASE_DURATION_S[k] * scale) for k in KINDS}
    warmup, quiet_tail = 0.08 * duration_s, 0.12 * duration_s
    alone_span = sum(dur.values())
    gap = max(1.0, 0.45 * (duration_s - warmup - quiet_tail) - alone_span) / len(KINDS)
    faults: list[Fault] = []
    t = warmup
    for kind in rng.sample(KINDS, len(KINDS)):
        faults.append(Fault(kind, round(t, 2), round(dur[kind], 2), _target(kind, rng, replicas, backends)))
        t += dur[kind] + gap
    end = duration_s - quiet_tail
    # overlapping: the PostgreSQL outage first, a replica kill and a Redis restart inside it, the rest at random
    outage_at = t + rng.uniform(0, max(0.0, end - t - dur["postgres_stop"]))
    inside = {"replica_kill": 0.3, "redis_restart": 0.6}
    for kind in KINDS:
        if kind == "postgres_stop":
            start = outage_at
        elif kind in inside:
            start = outage_at + inside[kind] * dur["postgres_stop"]
        else:
            start = rng.uniform(t, max(t, end - dur[kind]))
        faults.append(Fault(kind, round(start, 2), round(dur[kind], 2), _target(kind, rng, replicas, backends),
                            overlapping=True))
    return sorted(faults, key=lambda f: (f.start_s, f.kind))


def _target(kind: str, rng: random.Random, replicas: int, backends: int) -> int:
    if kind == "replica_kill":
        return rng.randrange(replicas)
    if kind in ("backend_kill", "backend_slow"):
        return rng.randrange(backends)
    return 0


@dataclass
class Applied:
    """A fault as it happened: ``start_s`` to ``end_s`` (recovered), on the run's clock."""

    fault: Fault
    start_s: float
    end_s: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.fault), "applied_start_s": round(self.start_s, 2),
                "applied_end_s": None if self.end_s is None else round(self.end_s, 2), "error": self.error}


class Injector:
    """Applies faults to ``stack``; ``t0`` is the run's start (``time.perf_counter``). Before a
    backend is killed its counters are read (``on_backend_kill``), so the audit keeps what the
    dead process had counted."""

    def __init__(self, stack: ChaosStack, t0: float, on_backend_kill: Callable[[int], Any],
                 on_disconnects: Callable[[float], Any]) -> None:
        self.stack = stack
        self.t0 = t0
        self.on_backend_kill = on_backend_kill
        self.on_disconnects = on_disconnects
        self.applied: list[Applied] = []
        self.restarts: list[tuple[float, str, str]] = []  # (when, what, why) of each failed restart

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def run(self, faults: list[Fault]) -> None:
        await asyncio.gather(*(self._one(f) for f in faults))

    async def _one(self, fault: Fault) -> None:
        await asyncio.sleep(max(0.0, fault.start_s - self.now()))
        applied = Applied(fault, self.now())
        self.applied.append(applied)
        try:
            await getattr(self, "_" + fault.kind)(fault)
        except Exception as e:  # noqa: BLE001 (recorded: the run goes on and the report says so)
            applied.error = f"{type(e).__name__}: {e}"
        applied.end_s = self.now()

    async def _replica_kill(self, f: Fault) -> None:
        r = self.stack.replicas[f.target]
        await asyncio.to_thread(r.kill)
        await asyncio.sleep(f.duration_s)
        await self._restart(r.start, r.wait_ready, f"replica {f.target}")

    async def _restart(self, start: Callable[[], Any], wait_ready: Callable[[float], None], what: str) -> None:
        """Start a process again until it stays up, as a supervisor (Kubernetes, systemd) would: a
        process that exits at start-up (a replica with neither PostgreSQL nor a tenant snapshot) is
        started again every ``RESTART_BACKOFF_S`` until ``RESTART_TIMEOUT_S``."""
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while True:
            start()
            try:
                await asyncio.to_thread(wait_ready, 120.0)
                return
            except RuntimeError as e:  # exited at start-up
                self.restarts.append((round(self.now(), 1), what, str(e).splitlines()[-1][:200]))
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(RESTART_BACKOFF_S)

    async def _backend_kill(self, f: Fault) -> None:
        e, proxy = self.stack.emulators[f.target], self.stack.backend_proxies[f.target]
        proxy.pause()  # what the engine sends from now on never reaches a replica: its counters cover the rest
        try:
            await self.on_backend_kill(f.target)
            await asyncio.to_thread(e.kill)
            proxy.cut()
        finally:
            proxy.resume()
        await asyncio.sleep(f.duration_s)
        await self._restart(e.start, e.wait_ready, f"backend {f.target}")

    async def _redis_restart(self, f: Fault) -> None:
        redis = self.stack.redis
        assert redis is not None
        await asyncio.to_thread(redis.kill)
        await asyncio.sleep(f.duration_s)
        await asyncio.to_thread(redis.start)

    async def _postgres_stop(self, f: Fault) -> None:
        pg = self.stack.pg
        assert pg is not None
        await asyncio.to_thread(pg.stop, False)
        try:
            await asyncio.sleep(f.duration_s)
        finally:
            await asyncio.to_thread(pg.start)

    async def _postgres_slow(self, f: Fault) -> None:
        proxy = self.stack.pg_proxy
        assert proxy is not None
        proxy.delay_s = SLOW_POSTGRES_S
        try:
            await asyncio.sleep(f.duration_s)
        finally:
            proxy.delay_s = 0.0

    async def _backend_slow(self, f: Fault) -> None:
        proxy = self.stack.backend_proxies[f.target]
        proxy.delay_s = SLOW_BACKEND_S
        try:
            await asyncio.sleep(f.duration_s)
        finally:
            proxy.delay_s = 0.0

    async def _client_disconnect(self, f: Fault) -> None:
        await self.on_disconnects(f.duration_s)


async def cancel_quietly(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
