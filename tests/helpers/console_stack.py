"""A live stack for the console's tests: ``tokenomy up`` (1 prefill + 1 decode emulator) and
``tokenomy serve`` in AMPD mode with token operations (an admin key, a seeded tenant with a
budget, a breaker that trips on the third identical prompt), then some traffic: a three-turn
agent session and a runaway one the breaker stops. Everything runs on 127.0.0.1 and is stopped
by the fixture that starts it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from helpers.launch import serving, started, wait_until
from helpers.ports import free_port_base
from tokenomy.gateway.ops.keys import new_api_key

MODEL = "llama-3.1-8b"
ADMIN_KEY = "admin-console-test-0123456789"
PRICE = {"input_per_mtok": 3.0, "cached_input_per_mtok": 0.3, "output_per_mtok": 15.0}


@dataclass
class Stack:
    url: str  # the gateway
    engines: dict[str, str]  # instance id -> URL
    seeded_key: str
    tmp: Path


def chat(client: httpx.Client, key: str, session: str, messages: list[dict[str, str]],
         max_tokens: int = 16) -> httpx.Response:
    return client.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}", "x-session-id": session},
                       json={"model": MODEL, "messages": messages, "max_tokens": max_tokens})


def agent_session(client: httpx.Client, key: str, session: str, turns: int = 3) -> None:
    """A tool-using agent: each turn re-sends the history plus a tool result; every turn must be served."""
    messages = [{"role": "system", "content": f"You plan trips with tools ({session}). " * 40},
                {"role": "user", "content": "Find the cheapest flight to Lisbon."}]
    for turn in range(turns):
        r = chat(client, key, session, messages)
        assert r.status_code == 200, r.text
        messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"Tool result {turn}: 3 flights found."}]


def runaway(client: httpx.Client, key: str, session: str) -> httpx.Response:
    """The same prompt until the repetition breaker refuses it (repeat_limit 3: the third)."""
    messages = [{"role": "user", "content": "call search_flights(LIS) again"}]
    for _ in range(3):
        r = chat(client, key, session, messages)
    return r


@contextlib.contextmanager
def live_stack(tmp: Path) -> Iterator[Stack]:
    out = tmp / "cluster.json"
    with started([sys.executable, "-m", "tokenomy.cli.up_cmd", "--prefill", "1", "--decode", "1",
                  "--port-base", str(free_port_base(2)), "--time-scale", "0.1", "--json", str(out)],
                 stdout=subprocess.DEVNULL) as up:
        wait_until(out.exists, up, "tokenomy up")
        engines = {i["id"]: i["url"] for i in json.loads(out.read_text())["instances"]}
        key, port = new_api_key(), free_port_base(1)
        cfg = tmp / "gateway.yaml"
        cfg.write_text(json.dumps({
            "server": {"port": port},
            "backends": [{"id": i, "url": u, "role": i.split("-")[0]} for i, u in sorted(engines.items())],
            "routing": {"mode": "ampd", "slo": {"ttft_s": 2.0, "tpot_s": 0.05}},
            "health": {"interval_s": 0.5, "timeout_s": 10.0},  # a loaded CI machine answers late
            "ledger": {"url": f"sqlite:///{tmp}/ledger.db"},
            "prices": {MODEL: PRICE},
            "ops": {"server_secret": "console-test-secret-0123", "admin_key": ADMIN_KEY, "reservations": "memory",
                    "breaker": {"repeat_limit": 3},
                    "tenants": [{"org": "acme", "limits": {"budget_usd": 5.0},
                                 "teams": [{"name": "agents", "keys": [{"name": "ci-bot", "key": key}]}]},
                                {"org": "globex", "teams": [{"name": "research"}]}]},
        }))
        url = f"http://127.0.0.1:{port}"
        with serving([sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg), "--log-level", "warning"],
                     url, "gateway", cwd=tmp):
            with httpx.Client(base_url=url, timeout=60) as client:
                agent_session(client, key, "trip-planner-1")
                r = runaway(client, key, "runaway-agent")
                assert (r.status_code, r.json()["error"]["code"]) == (429, "breaker_repetition"), r.text
            yield Stack(url, engines, key, tmp)
