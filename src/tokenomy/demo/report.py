"""What ``tokenomy demo`` prints after the run: the SLO report, bills by token class (tenant tree
and the largest sessions), the breaker's event, the budget refusal, and where the console is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console

from tokenomy.bench import TurnResult
from tokenomy.demo.scenario import DemoRun
from tokenomy.gateway.metering.ledger import UsageEvent
from tokenomy.gateway.metering.usage_view import grouped_rows, tenant_tree, usage_table
from tokenomy.metrics.report import render_table

TOP_SESSIONS = 5


def _first_refusal(results: Sequence[TurnResult], needle: str) -> TurnResult | None:
    return next((r for r in sorted(results, key=lambda r: r.outcome.sent_s)
                 if r.outcome.status == "429" and needle in r.outcome.message), None)


def print_slo(run: DemoRun, console: Console) -> None:
    render_table({org: rep.summary for org, rep in run.reports.items()}, console=console,
                 title="SLO report per tenant, measured by the clients")


def print_placement(events: Sequence[UsageEvent], engines: Mapping[str, Mapping[str, float]],
                    console: Console) -> None:
    """Where AMPD ran each turn: per decode instance, turns decoded there, and how many of them
    were prefilled remotely (a KV pull from a prefill instance) or locally beside the decodes."""
    console.rule("AMPD placement")
    decoded: dict[str, int] = {}
    for e in events:
        if e.status == 200:
            decoded[e.backend] = decoded.get(e.backend, 0) + 1
    for inst, m in sorted(engines.items()):
        if inst.startswith("decode"):
            turns = decoded.get(inst, 0)
            remote = int(m.get("tokenomy:kv_transfers_total", 0))
            pulled = int(m.get("tokenomy:kv_transfer_tokens_total", 0))
            console.print(f"{inst}: decoded {turns} turns; {min(remote, turns)} prefilled remotely "
                          f"(KV of {pulled:,} tokens pulled), {max(turns - remote, 0)} prefilled here, "
                          f"beside the decodes", highlight=False)
        elif inst.startswith("prefill"):
            done = int(m.get("vllm:request_success_total", 0))
            history = int(m.get("tokenomy:kv_history_pull_tokens_total", 0))
            console.print(f"{inst}: {done} remote prefills ({history:,} history tokens pulled from decode "
                          f"instances instead of recomputed)", highlight=False)


def print_bills(events: Sequence[UsageEvent], names: Mapping[str, str], console: Console) -> None:
    total = sum(e.cost_usd for e in events)
    saved = sum(e.cache_savings_usd for e in events)
    console.print(usage_table(tenant_tree(events, names), "tenant",
                              title=f"Bills by tenant ({len(events)} requests in the ledger; "
                                    f"${total:.4f} spent, ${saved:.4f} saved by the prefix cache)"))
    console.print(usage_table(grouped_rows(events, "session", limit=TOP_SESSIONS), "session",
                              title=f"The {TOP_SESSIONS} largest sessions"))
    console.print("input: a session's first prompt; incr. prefill: what a later turn added; history: "
                  "the re-sent conversation; cached + recomputed = every prompt token. "
                  "Prices: the gateway config's prices (labelled defaults).", style="dim")


def print_breaker(run: DemoRun, alerts: Sequence[Mapping[str, Any]], console: Console) -> bool:
    """The runaway agent's calls and the breaker's trip; True when the breaker stopped it."""
    console.rule("Circuit breaker")
    calls = run.runaway
    ok = [c for c in calls if c["status"] == 200]
    stopped = next((c for c in calls if c["status"] == 429 and str(c["code"]).startswith("breaker_")), None)
    console.print(f"runaway-agent (acme/agents/runaway-bot) kept calling search(query='OSL-LIS Friday'): "
                  f"{len(calls)} requests, {len(ok)} answered", highlight=False)
    if stopped is None:
        console.print("the breaker did not stop it", style="bold red")
        return False
    console.print(f"call {stopped['call']}: 429 {stopped['code']}: {stopped['message']}", highlight=False)
    for a in alerts:
        if a.get("kind") == "breaker_trip":
            console.print(f"alert {a['kind']}: {a.get('subject')}: {a.get('message')}", highlight=False)
    return True


def print_budget(run: DemoRun, alerts: Sequence[Mapping[str, Any]], console: Console) -> bool:
    """The tight-budget tenant's refusal and the budget alerts (the gateway names the nodes in
    both); True when its budget refused a request."""
    console.rule("Budget")
    tight = min(run.tenants, key=lambda t: t.budget_usd)
    results = run.results.get(tight.org, [])
    refused = [r for r in results if r.outcome.status == "429" and "budget" in r.outcome.message]
    console.print(f"{tight.org} (budget ${tight.budget_usd:g}/day): {len(results)} turns sent, "
                  f"{len(refused)} refused by its budget", highlight=False)
    first = _first_refusal(results, "budget")
    if first is not None:
        console.print(f"first refusal: session {first.session_id} turn {first.index}: 429 "
                      f"{first.outcome.message}", highlight=False)
    for a in alerts:
        if a.get("kind") in ("budget_refusal", "budget_threshold"):
            console.print(f"alert {a['kind']}: {a.get('message')}", highlight=False)
    return first is not None


__all__ = ["print_bills", "print_breaker", "print_budget", "print_placement", "print_slo"]
