"""``tokenomy demo``: the live stack end to end, and nothing left behind, also when interrupted.

The demo runs as a user runs it (a process of its own), in a new session so that every process it
starts shares its process group: after it exits, no process of that group may remain and none of
its ports may answer.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.procs import group_members

pytestmark = pytest.mark.integration


def port_answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Demo:
    proc: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    out: list[str] = field(default_factory=list)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.out.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern!r} in {timeout_s}s; output:\n{''.join(self.out)}")

    def finish(self, timeout_s: float) -> tuple[int, str]:
        rc = self.proc.wait(timeout_s)
        while (line := self.lines.get(timeout=5)) is not None:
            self.out.append(line)
        return rc, "".join(self.out)


@pytest.fixture
def start_demo(tmp_path: Path) -> Iterator[object]:
    """Start ``tokenomy demo ARGS`` in a session of its own; on teardown kill whatever is left."""
    started: list[Demo] = []

    def start(*args: str) -> Demo:
        env = {**os.environ, "COLUMNS": "120", "PYTHONUNBUFFERED": "1"}
        # The default --out (out/demo, relative to the working directory), as `make demo` runs it.
        proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli.main", "demo", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True, cwd=tmp_path, env=env)
        demo = Demo(proc)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                demo.lines.put(line)
            demo.lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        started.append(demo)
        return demo

    try:
        yield start
    finally:
        for demo in started:
            if demo.proc.poll() is None:
                demo.proc.kill()
                demo.proc.wait()
            for pid in group_members(demo.proc.pid):
                os.kill(pid, signal.SIGKILL)


def _ports(text: str) -> list[int]:
    m = re.search(r"instances \(ports ([\d, ]+),", text)
    g = re.search(r"gateway in AMPD mode on http://127\.0\.0\.1:(\d+)", text)
    assert m and g, text
    return [int(p) for p in m.group(1).split(",")] + [int(g.group(1))]


def test_short_demo_runs_the_live_stack_and_leaves_nothing_behind(start_demo, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    demo = start_demo("--short")
    rc, text = demo.finish(150)
    assert rc == 0, text
    for section in ("stack up (pids", "SLO report per tenant", "TTFT P99 (ms)", "Bills by tenant",
                    "largest sessions", "AMPD placement", "Circuit breaker", "Budget", "web console:"):
        assert section in text, section
    # The bills: the tenant tree by name, token classes and dollars.
    assert re.search(r"^acme\s+\d+", text, re.M) and re.search(r"^skunkworks\s+\d+", text, re.M)
    assert re.search(r"└─ runaway-bot\s+\d+", text)
    assert "incr. prefill" in text and "recomputed" in text and "saved $" in text
    # The breaker stopped the runaway agent, and its trip reached the alert webhook.
    assert re.search(r"429 breaker_repetition", text) and "alert breaker_trip" in text
    # The tight budget refused requests.
    refused = re.search(r"(\d+) refused by its budget", text)
    assert refused and int(refused.group(1)) > 0 and "budget exceeded for org skunkworks" in text
    assert re.search(r"web console: http://127\.0\.0\.1:\d+/console\s+\(log in with the admin key admin-", text)
    assert group_members(demo.proc.pid) == []
    assert [p for p in _ports(text) if port_answers(p)] == []
    assert (tmp_path / "out" / "demo" / "ledger.db").is_file()


def test_ctrl_c_mid_run_stops_everything_the_demo_started(start_demo) -> None:  # type: ignore[no-untyped-def]
    """SIGINT goes to the demo alone (a terminal would signal the whole group): the demo itself must
    stop the cluster and the gateway while sessions are in flight."""
    demo = start_demo("--short")
    m = demo.wait_for(r"stack up \(pids ([\d ]+)\)", 90)
    children = [int(p) for p in m.group(1).split()]
    assert len(children) == 4 and set(children) <= set(group_members(demo.proc.pid))
    demo.wait_for(r"tenant acme/agents/runaway-bot", 10)
    os.kill(demo.proc.pid, signal.SIGINT)
    rc, text = demo.finish(60)
    assert rc == 130, text
    assert "interrupted: stopping everything the demo started" in text
    assert group_members(demo.proc.pid) == []
    assert [p for p in _ports(text) if port_answers(p)] == []


@pytest.mark.parametrize("delay_s", [0.0, 0.5])
def test_sigterm_while_the_cluster_starts_stops_what_was_started(start_demo, delay_s: float) -> None:  # type: ignore[no-untyped-def]
    """At once, the signal lands while the engines are being forked (a child forked but not yet
    registered must still be stopped); half a second later, while they start up."""
    demo = start_demo("--short")
    demo.wait_for(r"^starting 1 prefill", 60)
    time.sleep(delay_s)  # where in the start-up the signal lands; the test waits on the process, not on time
    os.kill(demo.proc.pid, signal.SIGTERM)
    rc, text = demo.finish(60)
    assert rc == 130, text
    assert group_members(demo.proc.pid) == []
