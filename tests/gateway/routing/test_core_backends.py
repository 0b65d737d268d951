"""Backends as routers see them, health with backoff, failover, and routing through tokenomy.policy."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.gateway_core_support import MODEL, FakeUpstream, free_port, serve
from tokenomy.gateway.config import BackendConfig, HealthConfig, config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageFilter
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.routing.backends import Backend, BackendPool, parse_prometheus
from tokenomy.gateway.stores.ledger_sql import SqlLedger
from tokenomy.policy.router import SessionAffinityRouter


def test_parse_prometheus_sums_label_sets_and_skips_comments() -> None:
    text = (
        "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a"} 3.0\nvllm:num_requests_running{model_name="b"} 2\n'
        'vllm:kv_cache_usage_perc{model_name="a",le="x}"} 0.5\nplain 7\nbroken{a="b"} nan-ish\n'
    )
    m = parse_prometheus(text)
    assert m["vllm:num_requests_running"] == 5.0 and m["vllm:kv_cache_usage_perc"] == 0.5 and m["plain"] == 7.0
    assert "broken" not in m


def test_backend_view_combines_scraped_and_own_counts() -> None:
    b = Backend(BackendConfig(id="b", url="http://x", total_blocks=100))
    BackendPool.apply_metrics(b, {"vllm:num_requests_running": 1, "vllm:num_requests_waiting": 2,
                                  "vllm:gpu_cache_usage_perc": 0.3})
    b.dispatched("r1", 500)
    b.dispatched("r2", 40)
    assert (b.num_waiting, b.num_waiting_tokens, b.free_blocks, b.kv_usage) == (2, 540, 70, 0.3)
    assert b.decode_context_tokens == 0
    b.first_token("r1")
    assert (b.num_waiting_tokens, b.num_decoding, b.decode_context_tokens) == (40, 1, 500)
    b.finished("r1", stream_key=9, context_tokens=520)
    assert b.decode_context_tokens == 0
    assert b.in_flight == 1 and b.cached_prefix_tokens(((9, 600),), 600) == 520
    assert b.cached_prefix_tokens(((9, 600),), 100) == 100 and b.cached_prefix_tokens(((8, 5),), 5) == 0


def test_backoff_doubles_per_failure_and_a_success_restores() -> None:
    pool = BackendPool((BackendConfig(id="b", url="http://x"),),
                       HealthConfig(backoff_initial_s=0.5, backoff_max_s=3.0), client=None)  # type: ignore[arg-type]
    b = pool.backends[0]
    delays = []
    for _ in range(5):
        pool.mark_down(b, 100.0, "test")
        delays.append(b.retry_at_s - 100.0)
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert pool.candidates(MODEL, 101.0) == [] and pool.candidates(MODEL, 104.0) == [b]
    pool.mark_up(b)
    assert b.healthy and b.failures == 0


def _wait(pred: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.mark.integration
def test_a_dead_backend_is_taken_out_retried_around_and_brought_back(tmp_path: Path) -> None:
    live, dead_port = FakeUpstream(), free_port()
    with serve(live.app()) as live_url:
        cfg = config_from_dict({
            "backends": [{"id": "dead", "url": f"http://127.0.0.1:{dead_port}"}, {"id": "live", "url": live_url}],
            "router": {"name": "round_robin"},
            "health": {"interval_s": 0.05, "backoff_initial_s": 0.05, "backoff_max_s": 0.1},
            "ledger": {"url": f"sqlite:///{tmp_path}/l.db"},
        })
        ledger = SqlLedger(cfg.ledger.url)
        try:
            with serve(build_app(cfg, guard=AllowAllGuard(), ledger=ledger)) as url, httpx.Client(base_url=url) as http:
                body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
                for _ in range(4):
                    assert http.post("/v1/chat/completions", json=body).status_code == 200
                assert {e.backend for e in ledger.query(UsageFilter())} == {"live"}
                assert http.get("/health").json()["backends"] == {"dead": False, "live": True}
                revived = FakeUpstream()
                with serve(revived.app(), port=dead_port):
                    _wait(lambda: http.get("/health").json()["backends"]["dead"])
                    for _ in range(4):
                        assert http.post("/v1/chat/completions", json=body).status_code == 200
                assert len(revived.usages) == 2  # round robin over both again
                assert "tokenomy_gateway_upstream_failures_total" in http.get("/metrics").text
        finally:
            ledger.close()


@pytest.mark.integration
def test_session_affinity_is_the_policy_router_and_keeps_a_session_on_one_backend(tmp_path: Path) -> None:
    ups = [FakeUpstream() for _ in range(3)]
    with serve(ups[0].app()) as u0, serve(ups[1].app()) as u1, serve(ups[2].app()) as u2:
        cfg = config_from_dict({
            "backends": [{"id": f"b{i}", "url": u} for i, u in enumerate((u0, u1, u2))],
            "router": {"name": "session_affinity", "options": {"kv_usage_threshold": 0.9}},
            "ledger": {"url": f"sqlite:///{tmp_path}/l.db"},
        })
        ledger = SqlLedger(cfg.ledger.url)
        try:
            app = build_app(cfg, guard=AllowAllGuard(), ledger=ledger)
            assert isinstance(app.state.proxy.routing.router, SessionAffinityRouter)
            with serve(app) as url, httpx.Client(base_url=url) as http:
                for turn in range(4):
                    for s in ("s1", "s2", "s3"):
                        body = {"model": MODEL, "messages": [{"role": "user", "content": f"{s} turn {turn}"}],
                                "max_tokens": 2}
                        r = http.post("/v1/chat/completions", json=body, headers={"x-session-id": s})
                        assert r.status_code == 200
            by_session: dict[str, set[str]] = {}
            for e in ledger.query(UsageFilter()):
                by_session.setdefault(e.session_id, set()).add(e.backend)
            assert all(len(v) == 1 for v in by_session.values()) and len(by_session) == 3
        finally:
            ledger.close()
