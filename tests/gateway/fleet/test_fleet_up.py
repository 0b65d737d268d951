"""``tokenomy up`` with a ``fleet:`` section: the engines, Redis, PostgreSQL and 2 gateway replicas
come up together, serve one key's budget fleet-wide, and all stop with the command."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from helpers.ports import free_port_base
from tokenomy.gateway.ops.keys import new_api_key

pytestmark = pytest.mark.integration


def test_tokenomy_up_starts_a_fleet_and_stops_it(tmp_path: Path) -> None:
    key = new_api_key()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({
        "pools": [{"role": "mixed", "count": 1}], "engine": {"time_scale": 0.2},
        "fleet": {"replicas": 2, "port_base": free_port_base(2), "gateway": {
            "prices": {"llama-3.1-8b": {"input_per_mtok": 1.0, "cached_input_per_mtok": 1.0, "output_per_mtok": 2.0}},
            "ops": {"tenants": [{"org": "o", "teams": [{"name": "t", "keys": [
                {"name": "k", "key": key, "limits": {"budget_usd": 0.0001}}]}]}]}}},  # room for 2 of these
    }))
    out = tmp_path / "up.json"
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli.up_cmd", str(cluster), "--port-base", str(free_port_base(1)),
                             "--json", str(out)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not out.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "tokenomy up did not come up"
            time.sleep(0.2)
        gateways = json.loads(out.read_text())["gateways"]
        assert len(gateways) == 2
        statuses = []
        for i in range(4):  # $0.00004 worst case each: the budget holds 2, wherever they go
            r = httpx.post(gateways[i % 2] + "/v1/chat/completions", timeout=30,
                           headers={"authorization": f"Bearer {key}"},
                           json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 19, "ignore_eos": True})
            statuses.append(r.status_code)
        assert statuses == [200, 200, 429, 429], statuses
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True).stdout
    assert proc.returncode == 0 and not children.strip()  # engines, Redis, PostgreSQL, replicas: all gone
