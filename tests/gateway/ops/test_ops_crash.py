"""SIGKILL the gateway mid-load and restart it: no reservation is left held, spend equals the ledger.

Both budget stores: ``sql`` (holds are rows, reconciled at start-up) and ``memory`` (the default:
holds die with the process, spend is rebuilt from the ledger at start-up)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from helpers.gateway_core_support import MODEL, FakeUpstream, free_port, serve
from helpers.ops_factory import SECRET
from tokenomy.gateway.ops.keys import new_api_key

pytestmark = pytest.mark.integration


def _start(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.gateway", "--config", str(config),
                             "--port", str(port)], stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("gateway did not start")


def _holds(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT count(*) FROM tk_holds").fetchone()[0])
    finally:
        conn.close()


ADMIN = "admin-" + "c" * 20


@pytest.mark.parametrize("store", ["sql", "memory"])
def test_sigkill_mid_load_leaves_no_reservation_held(tmp_path: Path, store: str) -> None:
    key = new_api_key()
    db = tmp_path / "ledger.db"
    upstream = FakeUpstream(token_delay_s=0.02)
    with serve(upstream.app()) as up_url:
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "backends": [{"id": "b1", "url": up_url}],
            "ledger": {"url": f"sqlite:///{db}"},
            "ops": {"server_secret": SECRET, "admin_key": ADMIN, "reservations": store, "tenants": [{"org": "o", "teams": [{"name": "t", "keys": [
                {"name": "k", "key": key, "limits": {"budget_usd": 100.0}}]}]}]},
        }))
        port = free_port()
        log = tmp_path / "gateway.log"
        proc = _start(config, port, log)
        done: list[str] = []
        streaming: list[str] = []  # got its first chunk: the gateway holds its reservation

        def client(i: int) -> None:
            # streams: half finish in ~0.1 s, half take ~4 s, so the kill finds some in flight
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}],
                    "max_tokens": 5 if i % 2 == 0 else 200, "stream": True}
            try:
                with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30,
                                  headers={"authorization": f"Bearer {key}", "x-request-id": f"req-{i}"}) as r:
                    chunks = r.iter_text()
                    text = next(chunks, "")
                    streaming.append(f"req-{i}")
                    text += "".join(chunks)
                if r.status_code == 200 and "[DONE]" in text and "error" not in text:
                    done.append(f"req-{i}")
            except httpx.HTTPError:
                pass  # the gateway died under this request

        try:
            threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # kill once some finished and others hold budget
                if done and set(streaming) - set(done) and (store == "memory" or _holds(db) > 0):
                    break
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            for t in threads:
                t.join(30)
            held_before = _holds(db) if store == "sql" else len(set(streaming) - set(done))
            proc = _start(config, port, log)  # the restart reconciles the dead process's holds
            key_id = next(k["id"] for k in httpx.get(f"http://127.0.0.1:{port}/admin/keys", timeout=5,
                                                     headers={"authorization": f"Bearer {ADMIN}"}).json()["data"])
            budget = httpx.get(f"http://127.0.0.1:{port}/admin/budget/{key_id}", timeout=5,
                               headers={"authorization": f"Bearer {ADMIN}"}).json()
            with sqlite3.connect(db) as conn:
                holds = _holds(db) if store == "sql" else 0
                ledger_usd = conn.execute("SELECT coalesce(sum(cost_usd), 0) FROM usage_events").fetchone()[0]
                ids = [r[0] for r in conn.execute("SELECT request_id FROM usage_events")]
        finally:
            proc.kill()
            proc.wait(10)
    assert held_before > 0, "the kill came after every request finished: nothing was tested"
    assert holds == 0 and budget["reserved_usd"] == pytest.approx(0.0, abs=1e-12)
    assert budget["spent_usd"] == pytest.approx(ledger_usd, abs=1e-12)
    assert set(done) <= set(ids) and len(ids) == len(set(ids))
