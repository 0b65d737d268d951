"""Overload through the app: the lowest priority is shed first with 503 + retry-after."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from helpers.gateway_core_support import MODEL, FakeUpstream, serve
from helpers.ops_factory import SECRET
from helpers.polling import wait_for
from tokenomy.gateway.config import config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.ops.keys import new_api_key
from tokenomy.gateway.stores.ledger_sql import SqlLedger

pytestmark = pytest.mark.integration


def test_a_full_queue_sheds_the_low_priority_request_for_the_high_one(tmp_path: Path) -> None:
    lo, hi = new_api_key(), new_api_key()
    upstream = FakeUpstream(token_delay_s=0.01)
    with serve(upstream.app()) as up_url:
        cfg = config_from_dict({
            "backends": [{"id": "b1", "url": up_url}],
            "ledger": {"url": f"sqlite:///{tmp_path}/ledger.db"},
            "ops": {"server_secret": SECRET, "admission": {"max_in_flight": 1, "max_queue_depth": 1,
                                                           "retry_after_s": 2},
                    "tenants": [{"org": "o", "teams": [{"name": "t", "keys": [
                        {"name": "lo", "key": lo, "limits": {"priority": 1}},
                        {"name": "hi", "key": hi, "limits": {"priority": 9}}]}]}]},
        })
        ledger = SqlLedger(cfg.ledger.url)
        app = build_app(cfg, ledger=ledger)
        results: dict[str, httpx.Response] = {}

        def call(name: str, key: str, max_tokens: int) -> None:
            body = {"model": MODEL, "messages": [{"role": "user", "content": name}], "max_tokens": max_tokens}
            results[name] = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30,
                                       headers={"authorization": f"Bearer {key}"})

        try:
            with serve(app) as url:
                pool = app.state.guard.admission
                body = {"model": MODEL, "messages": [{"role": "user", "content": "first"}], "max_tokens": 1000,
                        "stream": True}  # ~10 s upstream: holds the only slot while the others arrive
                threads = []
                with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30,
                                  headers={"authorization": f"Bearer {lo}"}) as r:
                    lines = r.iter_lines()  # keep the iterator: dropping it would close the stream
                    next(lines)  # the slot is taken
                    assert pool.signals("default").in_flight == 1
                    threads.append(threading.Thread(target=call, args=("lo-queued", lo, 2)))
                    threads[-1].start()
                    wait_for(lambda: pool.signals("default").queue_depth == 1, 20.0, 0.01, "one request queued")
                    threads.append(threading.Thread(target=call, args=("hi", hi, 2)))
                    threads[-1].start()
                    wait_for(lambda: "lo-queued" in results, 20.0, 0.01, "the low-priority request answered")
                    assert "hi" not in results  # still queued behind the stream
                # leaving the stream disconnects it: the slot passes to the queued high-priority request
                for t in threads:
                    t.join(30)
        finally:
            ledger.close()
    shed = results["lo-queued"]
    assert shed.status_code == 503 and shed.json()["error"]["code"] == "overloaded"
    assert shed.headers["retry-after"] == "2"
    assert results["hi"].status_code == 200
