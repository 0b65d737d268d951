"""Token classes of multi-turn sessions, and the ledger's durability and idempotency."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from helpers.gateway_core_support import MODEL, FakeUpstream, serve
from tokenomy.gateway.config import Price, config_from_dict
from tokenomy.gateway.http.app import build_app
from tokenomy.gateway.metering.ledger import UsageEvent, UsageFilter
from tokenomy.gateway.metering.meter import SessionState, classify, cost
from tokenomy.gateway.ops.allow_all import AllowAllGuard
from tokenomy.gateway.stores.ledger_sql import SqlLedger


def test_classes_partition_the_prompt_turn_by_turn() -> None:
    first = classify(None, prompt_tokens=100, output_tokens=20, cached_tokens=0)
    assert (first.turn, first.input_tokens, first.incremental_prefill_tokens, first.history_tokens) == (0, 100, 0, 0)
    second = classify(SessionState(0, 100, 20), prompt_tokens=150, output_tokens=10, cached_tokens=112)
    assert (second.turn, second.input_tokens, second.incremental_prefill_tokens, second.history_tokens) == (1, 0, 30, 120)
    assert (second.cached_tokens, second.recomputed_tokens) == (112, 38)
    edited = classify(SessionState(1, 150, 10), prompt_tokens=90, output_tokens=5, cached_tokens=500)
    assert (edited.history_tokens, edited.incremental_prefill_tokens, edited.cached_tokens) == (90, 0, 90)


def test_cost_prices_cache_hits_apart() -> None:
    c = cost(classify(None, 1_000_000, 1_000_000, 400_000),
             Price(input_per_mtok=1.0, cached_input_per_mtok=0.25, output_per_mtok=3.0))
    assert (c.recomputed_usd, c.cached_usd, c.output_usd) == pytest.approx((0.6, 0.1, 3.0))
    assert c.cache_savings_usd == pytest.approx(0.3) and c.total_usd == pytest.approx(3.7)


def _event(rid: str, ts: float = 1.0, tenant: str = "org/team/key", session: str = "") -> UsageEvent:
    return UsageEvent(rid, ts, tenant, tenant.rsplit("/", 1)[-1], MODEL, "b1", "chat", False, 200, "ok", session, 0,
                      10, 10, 0, 0, 5, 0, 10, 1e-6, 0.0, 3e-6, 4e-6, 0.0, None, None, 0.01)


@pytest.mark.parametrize("writer", ["inline", "thread"])
def test_group_commit_makes_every_event_durable_exactly_once(tmp_path: Path, writer: str) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    ledger = SqlLedger(url, max_batch=16, writer=writer)

    async def main() -> None:
        await asyncio.gather(*(ledger.record(_event(f"r{i % 150}")) for i in range(300)))

    asyncio.run(main())
    ledger.close()
    reopened = SqlLedger(url)  # a fresh process's view: only what was committed
    try:
        ids = [e.request_id for e in reopened.query(UsageFilter())]
        assert sorted(ids) == sorted(f"r{i}" for i in range(150))
        assert reopened.cost_usd("r7") == pytest.approx(4e-6) and reopened.cost_usd("nope") is None
    finally:
        reopened.close()


def test_query_filters_by_subtree_not_by_string_prefix(tmp_path: Path) -> None:
    ledger = SqlLedger(f"sqlite:///{tmp_path}/l.db")
    try:
        ledger.record_sync([_event("a", tenant="org/team/k1"), _event("b", tenant="org/team2/k2"),
                            _event("c", ts=5.0, tenant="org/team/k3")])
        assert [e.request_id for e in ledger.query(UsageFilter(tenant_prefix="org/team"))] == ["a", "c"]
        assert [e.request_id for e in ledger.query(UsageFilter(tenant_prefix="org", since_s=2.0))] == ["c"]
    finally:
        ledger.close()


@pytest.mark.parametrize("writer", ["inline", "thread"])
def test_a_failed_commit_fails_the_waiting_request(tmp_path: Path, writer: str) -> None:
    ledger = SqlLedger(f"sqlite:///{tmp_path}/l.db", writer=writer)
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE usage_events")

    async def main() -> None:
        with pytest.raises(RuntimeError, match="ledger write failed"):
            await ledger.record(_event("x"))

    asyncio.run(main())
    ledger.close()


@pytest.mark.integration
def test_five_turn_session_classes_match_the_backends_usage_and_survive_a_restart(tmp_path: Path) -> None:
    upstream = FakeUpstream(block_tokens=4)
    db = f"sqlite:///{tmp_path}/ledger.db"
    with serve(upstream.app()) as up_url:
        cfg = config_from_dict({"backends": [{"id": "b1", "url": up_url}], "ledger": {"url": db}})
        messages: list[dict[str, str]] = [{"role": "system", "content": "you are a careful agent " * 5}]

        def run_turns(url: str, turns: range, how: str) -> None:
            with httpx.Client(base_url=url, timeout=10) as http:
                for k in turns:
                    messages.append({"role": "user", "content": f"tool result {k} " + "data " * (3 + k)})
                    body = {"model": MODEL, "messages": messages, "max_tokens": 6 + k, "stream": k % 2 == 1}
                    headers = {"x-request-id": f"t{k}"}
                    if how == "header":
                        headers["x-session-id"] = "agent-1"
                    else:
                        body["metadata"] = {"session_id": "agent-1"}
                    r = http.post("/v1/chat/completions", json=body, headers=headers)
                    assert r.status_code == 200
                    messages.append({"role": "assistant", "content": " ".join(f"w{i}" for i in range(6 + k))})

        ledger = SqlLedger(db)
        with serve(build_app(cfg, guard=AllowAllGuard(), ledger=ledger)) as url:
            run_turns(url, range(0, 3), "header")
        ledger.close()
        ledger = SqlLedger(db)  # a restarted gateway learns the session's last turn from the ledger
        with serve(build_app(cfg, guard=AllowAllGuard(), ledger=ledger)) as url:
            run_turns(url, range(3, 5), "metadata")
        events = ledger.query(UsageFilter(session_id="agent-1"))
        ledger.close()
    assert [e.turn for e in events] == [0, 1, 2, 3, 4]
    prev = None
    for ev, usage in zip(events, upstream.usages, strict=True):
        assert ev.prompt_tokens == usage["prompt_tokens"] and ev.output_tokens == usage["completion_tokens"]
        assert ev.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]
        assert ev.recomputed_tokens == ev.prompt_tokens - ev.cached_tokens
        if prev is None:
            assert (ev.input_tokens, ev.incremental_prefill_tokens, ev.history_tokens) == (ev.prompt_tokens, 0, 0)
        else:
            carried = prev["prompt_tokens"] + prev["completion_tokens"]
            assert (ev.input_tokens, ev.history_tokens) == (0, carried)
            assert ev.incremental_prefill_tokens == usage["prompt_tokens"] - carried > 0
            assert ev.cached_tokens > 0
        prev = usage
