"""Alerts: webhook JSON to a local receiver, a bounded queue that never blocks, spend-rate anomalies."""

from __future__ import annotations

import asyncio
import json

import pytest

from tokenomy.gateway.ops.alerts import Alert, Alerter, AlertsConfig, SpendRateMonitor


async def _receiver(bodies: list[dict], status: int = 200):
    """A minimal HTTP server on 127.0.0.1 that records JSON bodies."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        bodies.append(json.loads(await reader.readexactly(length)))
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.integration
def test_webhook_posts_alert_json_to_a_local_receiver():
    async def main():
        bodies: list[dict] = []
        server, port = await _receiver(bodies)
        try:
            alerter = Alerter(AlertsConfig(webhook_url=f"http://127.0.0.1:{port}/hook", timeout_s=5))
            alerter.emit(Alert("budget_threshold", "key_1", "spent 80%", 12.5, {"threshold": 0.8}))
            alerter.emit(Alert("breaker_trip", "session s", "breaker_repetition", 13.0))
            await asyncio.wait_for(alerter.drain(), 10)
            await alerter.close()
        finally:
            server.close()
            await server.wait_closed()
        assert [b["kind"] for b in bodies] == ["budget_threshold", "breaker_trip"]
        assert bodies[0] == {"kind": "budget_threshold", "subject": "key_1", "message": "spent 80%",
                             "at_s": 12.5, "data": {"threshold": 0.8}}
        assert alerter.sent == 2

    asyncio.run(main())


def test_a_stuck_webhook_never_blocks_emit_and_the_queue_is_bounded():
    async def main():
        gate = asyncio.Event()
        posted: list[str] = []

        async def slow_post(url, body):
            await gate.wait()
            posted.append(body["subject"])

        alerter = Alerter(AlertsConfig(webhook_url="http://127.0.0.1:9/x", queue_size=3), post=slow_post)
        for i in range(10):
            alerter.emit(Alert("spend_rate", f"k{i}", "fast", float(i)))  # returns at once
        await asyncio.sleep(0)
        assert alerter.dropped >= 6
        gate.set()
        await alerter.drain()
        await alerter.close()
        assert posted[0] == "k0" and len(posted) == 10 - alerter.dropped

    asyncio.run(main())


def test_a_failing_webhook_is_counted_not_raised():
    async def main():
        async def broken(url, body):
            raise OSError("connection refused")

        alerter = Alerter(AlertsConfig(webhook_url="http://127.0.0.1:9/x"), post=broken)
        alerter.emit(Alert("breaker_trip", "s", "m", 0.0))
        await alerter.drain()
        await alerter.close()
        assert alerter.failed == 1

    asyncio.run(main())


def test_spend_rate_anomaly_alerts_once_until_the_rate_falls():
    mon = SpendRateMonitor(usd_per_hour=10.0, window_s=60.0)  # $10/h = $0.1667 per minute
    assert mon.add("k", 0.10, 0.0) is None
    rate, reason = mon.add("k", 0.10, 10.0)
    assert rate == pytest.approx(12.0) and "threshold" in reason
    assert mon.add("k", 0.10, 20.0) is None  # still fast: no second alert
    assert mon.add("k", 0.0, 200.0) is None  # the window emptied: quiet again
    assert mon.add("k", 0.2, 201.0) is not None


def test_relative_anomaly_against_the_keys_own_baseline():
    """A key steady at $1/h for an hour, then at $12/h: flagged as 12x its baseline (warm-up first)."""
    mon = SpendRateMonitor(None, window_s=300.0, factor=5.0, baseline_s=3600.0, min_usd_per_hour=0.5)
    t = 0.0
    while t < 7200.0:  # $1/h: $1/60 every minute
        assert mon.add("k", 1 / 60, t) is None
        t += 60.0
    got = None
    for i in range(10):  # $12/h: $0.2 every minute
        got = got or mon.add("k", 0.2, t + 60.0 * i)
    assert got is not None
    rate, reason = got
    assert rate > 5.0 and "baseline" in reason
    assert SpendRateMonitor(None, 300.0, factor=5.0, baseline_s=3600.0).add("new", 5.0, 0.0) is None  # warm-up


def test_guard_emits_spend_rate_alerts_and_counts_refusals_and_trips(tmp_path):
    from prometheus_client import generate_latest

    from helpers.ops_factory import add_key, make_guard, request
    from tokenomy.gateway.errors import GatewayError
    from tokenomy.gateway.ops.guard import SettledUsage

    guard = make_guard(tmp_path, alerts={"spend_rate_usd_per_hour": 1.0, "spend_rate_window_s": 60},
                       breaker={"repeat_limit": 2})
    raw, key_id = add_key(guard)
    adm = asyncio.run(guard.admit(request(raw, "r1", session="s", fingerprint="same")))
    asyncio.run(guard.settle(adm, SettledUsage(100, 10, 0, 0.05)))  # $0.05 a minute = $3/h
    with pytest.raises(GatewayError):
        asyncio.run(guard.admit(request(raw, "r2", session="s", fingerprint="same")))
    with pytest.raises(GatewayError):
        asyncio.run(guard.admit(request(None, "r3")))
    kinds = [a.kind for a in guard.alerter.recent]
    assert kinds == ["spend_rate", "breaker_trip"]
    text = generate_latest(guard.metrics.registry).decode()
    assert 'tokenomy_gateway_breaker_trips_total{code="breaker_repetition",scope="session"} 1.0' in text
    assert 'tokenomy_gateway_ops_refusals_total{code="breaker_repetition"} 1.0' in text
    assert 'tokenomy_gateway_ops_refusals_total{code="missing_api_key"} 1.0' in text
    assert 'tokenomy_gateway_alerts_total{kind="spend_rate"} 1.0' in text


@pytest.mark.integration
def test_gateway_shutdown_posts_the_alerts_still_queued(tmp_path):
    """The app's lifespan closes token operations: an alert queued at shutdown still reaches the webhook."""
    from tokenomy.gateway.config import config_from_dict
    from tokenomy.gateway.http.app import build_app

    async def main() -> list[dict]:
        bodies: list[dict] = []
        server, port = await _receiver(bodies)
        cfg = config_from_dict({
            "backends": [{"id": "b1", "url": "http://127.0.0.1:9"}],
            "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
            "ops": {"server_secret": "s" * 32, "alerts": {"webhook_url": f"http://127.0.0.1:{port}/hook"}},
        })
        app = build_app(cfg)
        inbox: asyncio.Queue[dict] = asyncio.Queue()
        outbox: asyncio.Queue[dict] = asyncio.Queue()
        lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                           inbox.get, outbox.put))
        await inbox.put({"type": "lifespan.startup"})
        assert (await asyncio.wait_for(outbox.get(), 10))["type"] == "lifespan.startup.complete"
        for i in range(3):
            app.state.guard.alerter.emit(Alert("breaker_trip", f"key k{i}", "test", 0.0, {}))
        await inbox.put({"type": "lifespan.shutdown"})  # at once: the webhook task has posted nothing yet
        assert (await asyncio.wait_for(outbox.get(), 10))["type"] == "lifespan.shutdown.complete"
        await asyncio.wait_for(lifespan, 10)
        server.close()
        return bodies

    bodies = asyncio.run(main())
    assert [b["subject"] for b in bodies] == ["key k0", "key k1", "key k2"]
