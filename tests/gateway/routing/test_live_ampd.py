"""Live AMPD: ``tokenomy up`` with 1 prefill + 2 decode emulators, ``tokenomy serve`` in ampd mode.

A 4-turn agent session (``x-session-id``) must decode every turn on one bound decode instance;
its first turn and a turn with a large tool result prefill remotely (a KV pull on the decode
instance's ``tokenomy:kv_transfers_total``), a turn with a small increment prefills locally on
the decode instance (no pull). ``disagg`` prefills every turn remotely. All seen through the
emulators' own ``/metrics``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.gateway_core_support import free_port
from helpers.launch import healthy, stop, wait_until
from tokenomy.emulator.launcher import port_free
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.routing.backends import parse_prometheus

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"
TRANSFERS = "tokenomy:kv_transfers_total"
PROMPT = "vllm:prompt_tokens_total"
GENERATED = "vllm:generation_tokens_total"
RETAINED = "tokenomy:kv_retained_requests_total"


@pytest.fixture(scope="module")
def pd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``tokenomy up --prefill 1 --decode 2``; yields instance id -> URL; always stopped."""
    out = tmp_path_factory.mktemp("up") / "cluster.json"
    base = free_port()
    while base > 65000 or not all(port_free("127.0.0.1", base + i) for i in range(3)):  # all three ports
        base = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli.up_cmd", "--prefill", "1", "--decode", "2",
                             "--port-base", str(base), "--time-scale", "0.2", "--json", str(out)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        wait_until(out.exists, proc, "tokenomy up", 90.0)
        insts = json.loads(out.read_text())
        yield {i["id"]: i["url"] for i in insts["instances"]}
    finally:
        stop(proc)


def _metrics(url: str) -> dict[str, float]:
    return parse_prometheus(httpx.get(url + "/metrics", timeout=5).text)


def _run_session(pd_cluster: dict[str, str], tmp_path: Path, routing: dict[str, object],
                 gateway_metrics: dict[str, float] | None = None) -> list[dict[str, dict[str, float]]]:
    """Start ``tokenomy serve`` with ``routing``, run a 4-turn session; each turn's metric deltas
    (and the gateway's own ``/metrics`` at the end into ``gateway_metrics``, by sample line)."""
    key = new_api_key()
    port = free_port()
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(json.dumps({
        "server": {"port": port},
        "backends": [{"id": i, "url": u, "role": i.split("-")[0]} for i, u in sorted(pd_cluster.items())],
        "routing": routing,
        "health": {"interval_s": 0.2},
        "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
        "ops": {"server_secret": "live-ampd-secret-0123", "reservations": "memory", "tenants": [
            {"org": "o", "teams": [{"name": "t", "keys": [{"name": "k", "key": key}]}]}]},
    }))
    gw = subprocess.Popen([sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg), "--log-level", "warning"],
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    sid = f"trip-{routing['mode']}"
    try:
        wait_until(healthy(url), gw, "tokenomy serve", 30)
        messages = [{"role": "system", "content": f"You are a travel agent with tools ({sid}). " * 60},
                    {"role": "user", "content": "Find the cheapest flight to Lisbon and book it."}]
        tool_results = ["ok", "fare table: " + "LIS 120 EUR, OPO 95 EUR, FAO 80 EUR; " * 400, "booked"]
        per_turn: list[dict[str, dict[str, float]]] = []
        with httpx.Client(base_url=url, timeout=60,
                          headers={"authorization": f"Bearer {key}", "x-session-id": sid}) as http:
            for turn in range(4):
                before = {i: _metrics(u) for i, u in pd_cluster.items()}
                r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                            "max_tokens": 8, "ignore_eos": True})
                assert r.status_code == 200, r.text
                after = {i: _metrics(u) for i, u in pd_cluster.items()}
                per_turn.append({i: {k: after[i].get(k, 0.0) - before[i].get(k, 0.0)
                                     for k in (TRANSFERS, PROMPT, GENERATED, RETAINED)} for i in pd_cluster})
                messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                if turn < 3:
                    messages.append({"role": "user", "content": f"Tool result: {tool_results[turn]}"})
        if gateway_metrics is not None:
            for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
                if line and not line.startswith("#"):
                    name, _, value = line.rpartition(" ")
                    gateway_metrics[name] = float(value)
        return per_turn
    finally:
        stop(gw)


def test_ampd_session_stays_on_its_decode_instance_and_only_remote_turns_pull_kv(
    pd_cluster: dict[str, str], tmp_path: Path
) -> None:
    assert sorted(pd_cluster) == ["decode-0", "decode-1", "prefill-0"]
    # TPOT bound 30 ms: a 2048-token chunk on the decode node breaks it, a few dozen tokens do not.
    gw: dict[str, float] = {}
    per_turn = _run_session(pd_cluster, tmp_path, {"mode": "ampd", "slo": {"ttft_s": 2.0, "tpot_s": 0.03}}, gw)
    decoded_on = [{i for i, d in t.items() if i.startswith("decode") and d[GENERATED] > 0} for t in per_turn]
    bound = decoded_on[0]
    assert len(bound) == 1 and all(d == bound for d in decoded_on), decoded_on  # one bound decode instance
    (decode,) = bound
    other = "decode-1" if decode == "decode-0" else "decode-0"
    assert all(t[other][PROMPT] == 0 for t in per_turn)  # the other decode instance never saw the session
    transfers = [t[decode][TRANSFERS] for t in per_turn]
    prefilled = [t["prefill-0"][PROMPT] > 0 for t in per_turn]
    # turn 0: first turn, remote; turn 1: a two-word tool result, local (no pull, prefill idle);
    # turn 2: a ~5k-token tool result breaks the TPOT bound on the decode node, remote (a pull).
    assert transfers[:3] == [1, 0, 1], per_turn
    assert prefilled[:3] == [True, False, True], per_turn
    assert transfers[3] == (1 if prefilled[3] else 0)  # a pull exactly when the prefill node ran it
    # short tool calls (the 5 s prior): every turn's KV was pinned across its tool call by a hint
    assert [t[decode][RETAINED] for t in per_turn] == [1, 1, 1, 1]
    # every turn went through the decode admission gate of its backend, which had room: none waited
    assert gw[f'tokenomy_gateway_ampd_held_total{{backend="{decode}",gate="decode"}}'] == 0
    assert gw[f'tokenomy_gateway_ampd_waiting{{backend="{decode}",gate="decode"}}'] == 0
    assert gw['tokenomy_gateway_ampd_waiting{backend="prefill-0",gate="prefill"}'] == 0


def test_disagg_prefills_every_turn_remotely(pd_cluster: dict[str, str], tmp_path: Path) -> None:
    per_turn = _run_session(pd_cluster, tmp_path, {"mode": "disagg"})
    for t in per_turn:
        assert t["prefill-0"][PROMPT] > 0 and t["prefill-0"][GENERATED] == 1  # prefill: max_tokens 1
        pulls = {i: d[TRANSFERS] for i, d in t.items() if i.startswith("decode")}
        assert sorted(pulls.values()) == [0, 1], per_turn  # one decode instance pulled the KV
        assert all(d[RETAINED] == 0 for d in t.values())  # no AMPD, no retention hints


def test_ampd_binds_a_messages_agent_session_to_one_decode_instance(pd_cluster: dict[str, str], tmp_path: Path) -> None:
    """A coding agent's turns over Anthropic Messages, its session named only inside
    ``metadata.user_id`` (a JSON string, as the agent sends it): one AMPD binding, one ledger session."""
    anthropic = pytest.importorskip("anthropic")
    import sqlite3

    key = new_api_key()
    port = free_port()
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(json.dumps({
        "server": {"port": port},
        "backends": [{"id": i, "url": u, "role": i.split("-")[0]} for i, u in sorted(pd_cluster.items())],
        "routing": {"mode": "ampd", "slo": {"ttft_s": 2.0, "tpot_s": 0.03}},
        "aliases": [{"match": "claude-*", "model": MODEL}],
        "health": {"interval_s": 0.2},
        "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
        "ops": {"server_secret": "live-ampd-secret-0123", "reservations": "memory", "tenants": [
            {"org": "o", "teams": [{"name": "t", "keys": [{"name": "k", "key": key}]}]}]},
    }))
    gw = subprocess.Popen([sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg), "--log-level", "warning"],
                          stdin=subprocess.DEVNULL, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    user_id = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": "cc-4f2a"})
    decoded_on = []
    try:
        wait_until(healthy(url), gw, "tokenomy serve", 30)
        client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
        messages: list[dict[str, object]] = [{"role": "user", "content": "Fix the failing test in ledger_sql.py."}]
        system = [{"type": "text", "text": "You are a coding agent. " * 80, "cache_control": {"type": "ephemeral"}}]
        for turn in range(5):
            before = {i: _metrics(u) for i, u in pd_cluster.items()}
            with client.messages.stream(model="claude-sonnet-4-6", max_tokens=8, system=system, messages=messages,
                                        metadata={"user_id": user_id}) as stream:
                text = "".join(stream.text_stream)
            after = {i: _metrics(u) for i, u in pd_cluster.items()}
            decoded_on.append({i for i in pd_cluster if i.startswith("decode")
                               and after[i].get(GENERATED, 0) > before[i].get(GENERATED, 0)})
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"Tool result {turn}: " + "test output line " * (3 + turn)}]
    finally:
        stop(gw)
    assert len(decoded_on[0]) == 1 and all(d == decoded_on[0] for d in decoded_on), decoded_on
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        rows = db.execute("SELECT session_id, turn, endpoint, requested_model FROM usage_events ORDER BY turn").fetchall()
    assert rows == [("cc-4f2a", t, "messages", "claude-sonnet-4-6") for t in range(5)]
