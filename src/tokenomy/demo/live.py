"""``tokenomy demo``: the whole system live, no GPU and no service to install.

Starts an emulated P/D cluster and the gateway in AMPD mode (:mod:`tokenomy.demo.stack`), runs two
tenants' agent sessions and a runaway agent through it (:mod:`tokenomy.demo.scenario`), prints
what happened (:mod:`tokenomy.demo.report`) and stops everything it started, also on Ctrl-C or
SIGTERM (exit status 130).
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
from pathlib import Path

from rich.console import Console

from tokenomy.demo.report import print_bills, print_breaker, print_budget, print_placement, print_slo
from tokenomy.demo.scenario import (
    DemoRun,
    DemoSettings,
    Tenant,
    cluster_spec,
    gateway_config,
    run_scenario,
    runaway_tenant,
    tenants,
)
from tokenomy.demo.stack import LiveStack
from tokenomy.emulator.launcher import Interrupts, LaunchError
from tokenomy.gateway.metering.ledger import UsageEvent, UsageFilter
from tokenomy.gateway.metering.usage_view import node_names
from tokenomy.gateway.stores.ledger_sql import SqlLedger

INTERRUPTED = 130


class _Ticker:
    """One progress line every ``every_s`` seconds while the sessions run."""

    def __init__(self, console: Console, every_s: float) -> None:
        self.console = console
        self.every_s = every_s
        self.counts: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="demo-ticker")

    def on_result(self, org: str, result: object) -> None:
        ok = getattr(getattr(result, "outcome", None), "ok", False)
        c = self.counts.setdefault(org, [0, 0])
        c[0 if ok else 1] += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            parts = [f"{org}: {c[0]} turns answered, {c[1]} refused or failed" for org, c in self.counts.items()]
            self.console.print(f"  {time.monotonic() - self._t0:5.0f}s  " + ("; ".join(parts) or "starting"),
                               highlight=False)

    def __enter__(self) -> _Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)


def _wait_for_alerts(stack: LiveStack, kinds: set[str], timeout_s: float) -> None:
    """The gateway posts alerts from a background task: give them a moment to arrive."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not kinds <= {a.get("kind") for a in stack.sink.alerts}:
        time.sleep(0.1)


DEMO_FILES = ("gateway.yaml", "gateway.log", "cluster.log", "ledger.db", "ledger.db-wal", "ledger.db-shm")
"""What the demo writes in its folder; a rerun removes these (the last run's ledger would count twice)
and nothing else, whatever folder ``--out`` names."""


def _clear(workdir: Path) -> None:
    for name in DEMO_FILES:
        (workdir / name).unlink(missing_ok=True)


def _announce(console: Console, settings: DemoSettings, people: list[Tenant], runaway: Tenant) -> None:
    for t in people:
        console.print(f"tenant {t.org}/{t.team}/{t.key_name}: budget ${t.budget_usd:g}/day, "
                      f"{settings.workload} agent sessions at {settings.rate_per_s:g}/s for "
                      f"{settings.duration_s:g}s", highlight=False)
    console.print(f"tenant {runaway.org}/{runaway.team}/{runaway.key_name}: one agent repeating a tool "
                  f"call (breaker: {settings.runaway_repeat_limit} identical calls in a row)", highlight=False)


def _ledger_events(url: str) -> list[UsageEvent]:
    ledger = SqlLedger(url)
    try:
        return ledger.query(UsageFilter(limit=10_000_000))
    finally:
        ledger.close()


def _report(run: DemoRun, stack: LiveStack, console: Console) -> bool:
    """Print every section; True when the breaker and the budget both acted."""
    _wait_for_alerts(stack, {"breaker_trip", "budget_refusal"}, 3.0)
    engines = stack.scrape_engines()
    url = f"sqlite:///{stack.workdir / 'ledger.db'}"
    events, names = _ledger_events(url), node_names(url)
    print_slo(run, console)
    print_bills(events, names, console)
    print_placement(events, engines, console)
    stopped = print_breaker(run, stack.sink.alerts, console)
    refused = print_budget(run, stack.sink.alerts, console)
    return stopped and refused


def _tail(log: Path, console: Console, lines: int = 5) -> None:
    if log.is_file():
        for line in log.read_text(errors="replace").splitlines()[-lines:]:
            console.print(f"  {line}", highlight=False, markup=False)


def _stay_up(stop: threading.Event) -> None:
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass  # the way --keep ends


def run_live_demo(settings: DemoSettings, workdir: Path, console: Console, keep: bool = False) -> int:
    """Run the demo; 0 when the breaker and the budget both acted, 1 otherwise, 130 when interrupted."""
    _clear(workdir)
    people, runaway = tenants(settings), runaway_tenant()
    admin_key = "admin-" + secrets.token_urlsafe(18)
    interrupts = Interrupts()
    stop = interrupts.stop
    stack = LiveStack(cluster_spec(settings), workdir)
    console_url = f"{stack.gateway_url}/console"
    try:
        with interrupts.installed():
            console.rule("Tokenomy live demo")
            console.print(f"starting 1 prefill + 2 decode emulated Llama-3.1-8B/H100 instances "
                          f"(ports {', '.join(str(i.port) for i in stack.instances)}, time scale "
                          f"{settings.time_scale:g}) and the gateway in AMPD mode on {stack.gateway_url}",
                          highlight=False)
            stack.start(lambda backends, alert_url: gateway_config(settings, people, runaway, admin_key,
                                                                   backends, alert_url), interrupts)
            console.print(f"stack up (pids {' '.join(str(p) for p in stack.pids())}); "
                          f"console while it runs: {console_url}  (admin key {admin_key})", highlight=False)
            _announce(console, settings, people, runaway)
            with _Ticker(console, 5.0 if settings.duration_s < 30 else 10.0) as ticker:
                run = run_scenario(stack.gateway_url, people, runaway, settings, on_result=ticker.on_result)
            console.print(f"sessions done in {run.wall_s:.1f}s", highlight=False)
            acted = _report(run, stack, console)
            console.rule("Console")
            console.print(f"web console: {console_url}  (log in with the admin key {admin_key})", highlight=False)
            console.print(f"ledger and logs: {workdir}  (tokenomy usage --db {workdir / 'ledger.db'} --by session)",
                          highlight=False)
            if keep:
                console.print("the stack keeps running: Ctrl-C to stop it", highlight=False)
                _stay_up(stop)
            else:
                console.print("the stack stops now; `tokenomy demo --keep` leaves it running for the console",
                              highlight=False)
            return 0 if acted else 1
    except KeyboardInterrupt:
        console.print("interrupted: stopping everything the demo started", highlight=False)
        return INTERRUPTED
    except LaunchError as exc:
        if stop.is_set():  # a signal while a child was starting: still an interruption
            console.print("interrupted: stopping everything the demo started", highlight=False)
            return INTERRUPTED
        console.print(f"tokenomy demo: {exc}; logs in {stack.workdir}", highlight=False, style="bold red")
        _tail(stack.workdir / "gateway.log", console)
        return 1
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup
        try:
            stack.stop()
        finally:
            signal.signal(signal.SIGINT, previous)


__all__ = ["run_live_demo"]
