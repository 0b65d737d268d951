"""Crash safety: SIGKILL the gateway under load and restart it.

Every request a client saw complete is in the ledger exactly once, and no budget hold is left
(holds in SQLite here, where a dead process can leave them; ``test_ops_crash.py`` covers both
stores through the admin API).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from helpers.gateway_core_support import MODEL, FakeUpstream, free_port, serve
from tokenomy.gateway.metering.ledger import UsageFilter
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.stores.ledger_sql import SqlLedger
from tokenomy.gateway.stores.reservations_sql import SqlReservations

pytestmark = pytest.mark.integration


def _start(cfg: Path, port: int, cwd: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg),
                             "--log-level", "warning"], cwd=cwd, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"gateway exited with {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("gateway did not start")


def test_sigkill_under_load_loses_no_acknowledged_request_and_leaves_no_hold(tmp_path: Path) -> None:
    key = new_api_key()
    port = free_port()
    db = tmp_path / "ledger.db"
    upstream = FakeUpstream(response_delay_s=0.01)
    with serve(upstream.app()) as up_url:
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(json.dumps({
            "server": {"port": port},
            "backends": [{"id": "b1", "url": up_url}],
            "ledger": {"url": f"sqlite:///{db}"},
            "ops": {"server_secret": "crash-test-secret-0123", "reservations": "sql", "tenants": [
                {"org": "o", "limits": {"budget_usd": 100.0},
                 "teams": [{"name": "t", "keys": [{"name": "k", "key": key}]}]}]},
        }))
        proc = _start(cfg, port, tmp_path)
        completed: list[str] = []
        broken: list[str] = []  # requests the kill cut: proof it came mid-load
        lock = threading.Lock()
        stop = threading.Event()

        def client(w: int) -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5,
                              headers={"authorization": f"Bearer {key}"}) as http:
                for i in range(10_000):
                    if stop.is_set():
                        return
                    rid = f"c{w}-{i}"
                    body = {"model": MODEL, "messages": [{"role": "user", "content": f"q {rid}"}], "max_tokens": 3,
                            "stream": i % 2 == 1}
                    try:
                        r = http.post("/v1/chat/completions", json=body, headers={"x-request-id": rid})
                        ok = r.status_code == 200 and (not body["stream"] or r.text.endswith("data: [DONE]\n\n")
                                                       and '"error"' not in r.text)
                    except httpx.HTTPError:
                        with lock:
                            broken.append(rid)
                        return  # the gateway is gone
                    if ok:
                        with lock:
                            completed.append(rid)

        threads = [threading.Thread(target=client, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 30
            while len(completed) < 150 and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            stop.set()
            for t in threads:
                t.join(10)
            if proc.poll() is None:
                proc.kill()
        assert len(completed) >= 150 and broken, "the kill found no request in flight: nothing was tested"
        proc = _start(cfg, port, tmp_path)  # restart: reconciles holds the dead process left
        try:
            assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    ledger = SqlLedger(f"sqlite:///{db}")
    try:
        ids = [e.request_id for e in ledger.query(UsageFilter(limit=100_000))]
    finally:
        ledger.close()
    assert len(ids) == len(set(ids))
    missing = set(completed) - set(ids)
    assert not missing, f"{len(missing)} acknowledged requests not in the ledger"
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        assert SqlReservations(engine).holds() == []
    finally:
        engine.dispose()
