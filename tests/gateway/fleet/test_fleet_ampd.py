"""A 10-turn AMPD session round-robined over 3 gateway replicas (one Redis, one PostgreSQL) lands
every turn on its bound decode instance, as the emulators' own metrics show, even when the other
decode instance looks the better pick to a replica that has not seen the session before."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from helpers.gateway_core_support import free_port
from helpers.launch import stop, wait_until
from helpers.ports import free_port_base
from helpers.servers import postgres_server, redis_server
from tokenomy.gateway.http.replicas import Replica, start_replicas, stop_all
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.routing.backends import parse_prometheus

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
PROMPT, GENERATED = "vllm:prompt_tokens_total", "vllm:generation_tokens_total"


def _metrics(url: str) -> dict[str, float]:
    return parse_prometheus(httpx.get(url + "/metrics", timeout=5).text)


@pytest.fixture(scope="module")
def ampd_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], list[Replica], str]]:
    tmp = tmp_path_factory.mktemp("ampd-fleet")
    out = tmp / "cluster.json"
    base = free_port_base(3)  # three consecutive ports, all free now
    up = subprocess.Popen([sys.executable, "-m", "tokenomy.cli.up_cmd", "--prefill", "1", "--decode", "2",
                           "--port-base", str(base), "--time-scale", "0.2", "--json", str(out)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    replicas: list[Replica] = []
    try:
        wait_until(out.exists, up, "tokenomy up", 120.0)
        cluster = {i["id"]: i["url"] for i in json.loads(out.read_text())["instances"]}
        key = new_api_key()
        with redis_server(tmp) as redis, postgres_server() as pg:
            cfg = tmp / "gateway.yaml"
            cfg.write_text(json.dumps({
                "backends": [{"id": i, "url": u, "role": i.split("-")[0]} for i, u in sorted(cluster.items())],
                "routing": {"mode": "ampd", "slo": {"ttft_s": 2.0, "tpot_s": 0.03}},
                "health": {"interval_s": 0.2},
                "ops": {"server_secret": "fleet-ampd-secret-0123",
                        "shared": {"redis_url": redis.url, "postgres_url": pg.url, "lease_s": 2.0, "timeout_s": 5.0,
                                   "outbox_dir": str(tmp)},
                        "tenants": [{"org": "o", "teams": [{"name": "t", "keys": [{"name": "k", "key": key}]}]}]},
            }))
            replicas = start_replicas(cfg, [free_port() for _ in range(3)], tmp)
            try:
                yield cluster, replicas, key
            finally:
                stop_all(replicas)
    finally:
        stop(up, timeout_s=20)


def test_a_10_turn_session_over_3_replicas_stays_on_its_bound_decode_instance(
        ampd_fleet: tuple[dict[str, str], list[Replica], str]) -> None:
    cluster, replicas, key = ampd_fleet
    decodes = sorted(i for i in cluster if i.startswith("decode"))
    messages = [{"role": "system", "content": "You are an agent with tools. " * 40},
                {"role": "user", "content": "Plan the trip."}]
    headers = {"authorization": f"Bearer {key}", "x-session-id": "fleet-trip"}
    stop = threading.Event()

    def busy(url: str) -> None:  # load straight on the bound instance: it looks the worse pick
        body = {"model": MODEL, "prompt": "background " * 50, "max_tokens": 4000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                for _ in r.iter_bytes():
                    if stop.is_set():
                        return
        except httpx.HTTPError:
            pass

    before = {d: _metrics(cluster[d]) for d in decodes}
    r = httpx.post(replicas[0].url + "/v1/chat/completions", headers=headers, timeout=60,
                   json={"model": MODEL, "messages": messages, "max_tokens": 8, "ignore_eos": True})
    assert r.status_code == 200, r.text
    generated = {d: _metrics(cluster[d])[GENERATED] - before[d][GENERATED] for d in decodes}
    (bound,) = [d for d, g in generated.items() if g > 0]
    (other,) = [d for d in decodes if d != bound]
    threads = [threading.Thread(target=busy, args=(cluster[bound],)) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)  # every replica's scrape sees the bound instance busy, the other idle
        other_before = _metrics(cluster[other])
        for turn in range(1, 10):
            messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                         {"role": "user", "content": f"Tool result {turn}: ok"}]
            r = httpx.post(replicas[turn % 3].url + "/v1/chat/completions", headers=headers, timeout=60,
                           json={"model": MODEL, "messages": messages, "max_tokens": 8, "ignore_eos": True})
            assert r.status_code == 200, r.text
        other_after = _metrics(cluster[other])
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    # the other decode instance never saw the session: no prompt, no generated token
    assert other_after.get(PROMPT, 0.0) == other_before.get(PROMPT, 0.0)
    assert other_after.get(GENERATED, 0.0) == other_before.get(GENERATED, 0.0)
