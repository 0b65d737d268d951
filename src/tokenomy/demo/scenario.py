"""What ``tokenomy demo`` runs on the live stack: two tenants' agent sessions through the gateway
(``tokenomy bench``'s runner), one of them on a tight budget, and one runaway agent that repeats a
tool call until the gateway's circuit breaker stops it.

The cluster is AMPD's: one prefill and two decode emulators; the gateway runs ``routing.mode:
ampd``. Sessions come from the ToolBench-like agent workload: a GAIA session thinks for minutes
between turns, too long for a two-minute demo (``tokenomy bench --workload gaia`` runs them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tokenomy.bench import BenchConfig, BenchReport, BenchRun, TurnResult, report
from tokenomy.core import SLO, Session
from tokenomy.emulator.cluster import ClusterSpec, Pool
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.workload.registry import load_workload

MODEL = "llama-3.1-8b"


@dataclass(frozen=True)
class Tenant:
    """One org with one team and one key that runs agent sessions (``key`` is the raw key)."""

    org: str
    team: str
    key_name: str
    budget_usd: float
    seed: int
    key: str = field(default_factory=new_api_key)


@dataclass(frozen=True)
class DemoSettings:
    """The knobs of one demo run. ``duration_s`` of session arrivals at ``rate_per_s`` per tenant
    (the run then waits for the sessions in flight); ``time_scale`` is the engines' wall seconds
    per modelled second; ``tight_budget_usd`` the second tenant's daily budget (labelled demo
    value, sized to run out within the run)."""

    duration_s: float = 60.0
    rate_per_s: float = 0.25
    max_sessions: int | None = None
    time_scale: float = 1.0
    workload: str = "toolbench"
    tight_budget_usd: float = 0.01
    runaway_repeat_limit: int = 5
    seed: int = 0

    @classmethod
    def short(cls) -> DemoSettings:
        """A run of about 20-30 s (tests, a quick look): fewer sessions, engines 4x faster."""
        return cls(duration_s=8.0, rate_per_s=0.5, max_sessions=4, time_scale=0.25, tight_budget_usd=0.002)


@dataclass
class DemoRun:
    """What the scenario produced, for the report."""

    tenants: list[Tenant]
    reports: dict[str, BenchReport]
    results: dict[str, list[TurnResult]]
    runaway: list[dict[str, Any]]
    wall_s: float


def cluster_spec(settings: DemoSettings) -> ClusterSpec:
    """1 prefill + 2 decode Llama-3.1-8B/H100 emulators, as ``tokenomy up --prefill 1 --decode 2``."""
    return ClusterSpec(pools=[Pool(role="prefill", count=1), Pool(role="decode", count=2)],
                       engine={"time_scale": settings.time_scale})


def tenants(settings: DemoSettings) -> list[Tenant]:
    return [
        Tenant("acme", "agents", "planner", budget_usd=5.0, seed=settings.seed),
        Tenant("skunkworks", "lab", "prototype", budget_usd=settings.tight_budget_usd, seed=settings.seed + 1),
    ]


def runaway_tenant() -> Tenant:
    """The runaway agent's key: a second key of acme's team, so its bill is its own leaf of the tree."""
    return Tenant("acme", "agents", "runaway-bot", budget_usd=5.0, seed=0)


def gateway_config(settings: DemoSettings, people: list[Tenant], runaway: Tenant, admin_key: str,
                   backends: list[dict[str, str]], alert_url: str) -> dict[str, Any]:
    """The gateway's config: AMPD routing over ``backends``, the tenants seeded with their keys,
    the repetition breaker at ``runaway_repeat_limit``, alerts posted to ``alert_url``."""
    orgs: dict[str, dict[str, Any]] = {}
    for t in [*people, runaway]:
        org = orgs.setdefault(t.org, {"org": t.org, "limits": {"budget_usd": t.budget_usd, "budget_period": "day"},
                                      "teams": []})
        team = next((x for x in org["teams"] if x["name"] == t.team), None)
        if team is None:
            team = {"name": t.team, "keys": []}
            org["teams"].append(team)
        team["keys"].append({"name": t.key_name, "key": t.key})
    return {
        "backends": backends,
        "routing": {"mode": "ampd", "perf": {"model": MODEL, "gpu": "h100", "tp": 1}},
        "health": {"interval_s": 0.5},
        "ledger": {"url": "sqlite:///ledger.db"},
        "ops": {
            "server_secret": secrets.token_urlsafe(24),
            "admin_key": admin_key,
            "reservations": "memory",
            "tenants": list(orgs.values()),
            "breaker": {"repeat_limit": settings.runaway_repeat_limit, "cooldown_s": 60},
            "alerts": {"webhook_url": alert_url},
        },
    }


def sessions_for(tenant: Tenant, settings: DemoSettings) -> list[Session]:
    """The tenant's sessions, ids prefixed with its org so the two tenants' bills never mix."""
    sessions = load_workload(settings.workload, rate_per_s=settings.rate_per_s, duration_s=settings.duration_s,
                             seed=tenant.seed, max_sessions=settings.max_sessions)
    return [dataclasses.replace(s, session_id=f"{tenant.org}-{s.session_id}") for s in sessions]


async def runaway_agent(gateway_url: str, key: str, max_calls: int, pause_s: float) -> list[dict[str, Any]]:
    """An agent stuck in a loop: it calls the same tool with the same arguments, gets the same
    error back, and tries again, until the gateway refuses it. One dict per call (status, code)."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a booking agent. Tools: search(query), book(id)."},
        {"role": "user", "content": "Book the cheapest flight from Oslo to Lisbon next Friday."},
    ]
    calls: list[dict[str, Any]] = []
    headers = {"authorization": f"Bearer {key}", "x-session-id": "runaway-agent"}
    async with httpx.AsyncClient(base_url=gateway_url, headers=headers, timeout=60) as http:
        for i in range(max_calls):
            r = await http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": messages, "max_tokens": 16, "ignore_eos": True})
            err = r.json().get("error", {}) if r.status_code != 200 else {}
            calls.append({"call": i + 1, "status": r.status_code, "code": err.get("code"),
                          "message": err.get("message")})
            if r.status_code != 200:
                break
            messages += [{"role": "assistant", "content": "search(query='OSL-LIS Friday')"},
                         {"role": "user", "content": "search error: upstream timeout"}]
            await asyncio.sleep(pause_s)
    return calls


def run_scenario(gateway_url: str, people: list[Tenant], runaway: Tenant, settings: DemoSettings,
                 on_result: Callable[[str, TurnResult], None] | None = None) -> DemoRun:
    """Both tenants' sessions and the runaway agent at once, through the gateway."""
    slo = SLO()
    gpus = sum(p.count for p in cluster_spec(settings).pools)
    configs = {t.org: BenchConfig(targets=(gateway_url,), model=MODEL, api_key=t.key, slo=slo, seed=t.seed,
                                  request_timeout_s=120.0, gpus=gpus) for t in people}

    def tagged(org: str) -> Callable[[TurnResult], None] | None:
        if on_result is None:
            return None
        report_one = on_result
        return lambda r: report_one(org, r)

    runs = {t.org: BenchRun(sessions_for(t, settings), configs[t.org], on_result=tagged(t.org)) for t in people}

    async def everything() -> tuple[list[list[TurnResult]], list[dict[str, Any]]]:
        benches = asyncio.gather(*(run.run() for run in runs.values()))
        agent = runaway_agent(gateway_url, runaway.key, 4 * settings.runaway_repeat_limit, 0.5 * settings.time_scale)
        return await asyncio.gather(benches, agent)

    wall0 = time.perf_counter()
    results, calls = asyncio.run(everything())
    wall = time.perf_counter() - wall0
    by_org = dict(zip(runs, results, strict=True))
    reports = {org: report(res, runs[org].t0, configs[org], wall) for org, res in by_org.items()}
    return DemoRun(people, reports, by_org, calls, wall)


__all__ = ["DemoRun", "DemoSettings", "Tenant", "cluster_spec", "gateway_config", "run_scenario", "runaway_tenant", "tenants"]
