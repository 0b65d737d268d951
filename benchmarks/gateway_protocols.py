"""What the gateway adds per front-door protocol: chat, Anthropic Messages and OpenAI Responses,
native pass-through and translated to chat, side by side in one run against one instant upstream.

The instant upstream (its own process) answers ``/v1/chat/completions``, ``/v1/messages`` and
``/v1/responses`` at once with a fixed answer and usage. Two gateways run as ``tokenomy serve`` in
the configuration of ``gateway_overhead.py`` (every token-operations feature on): one whose backends
serve all protocols (native pass-through), one whose backends declare only chat (the gateway
translates Messages and Responses to chat and the answers back). For each (protocol, path): p50 at
concurrency 1 minus the upstream's own p50 for the request it ends up receiving (alternating
rounds, so both see the same machine), and req/s at concurrency 32.

    python benchmarks/gateway_protocols.py --json out/gateway_protocols.json

Writes ``{"chat": {"p50_added_ms": x, "rps_c32": x}, "messages": {...}, "responses": {...},
"messages_translated": {...}, "responses_translated": {...}, "targets": {...}}``. Targets (issue 30):
native <= 1 ms p50 added and >= 0.8x chat's req/s; translated <= 2 ms p50 added.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gateway_overhead as go  # this folder's: the instant upstream's framing, the load loops, the config

MODEL = go.MODEL
_USAGE = {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 0}}
_BODIES = {
    b"/v1/chat/completions": json.dumps({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL, "usage": _USAGE,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }).encode(),
    b"/v1/messages": json.dumps({
        "id": "msg_bench", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "end_turn",
        "stop_sequence": None, "content": [{"type": "text", "text": "ok"}],
        "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1},
    }).encode(),
    b"/v1/responses": json.dumps({
        "id": "resp_bench", "object": "response", "created_at": 0, "status": "completed", "model": MODEL,
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
        "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 1,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13},
    }).encode(),
}
_REQUESTS = {  # protocol -> (path, body)
    "chat": (b"/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "say ok"}]}),
    "messages": (b"/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "say ok"}]}),
    "responses": (b"/v1/responses", {"model": MODEL, "max_output_tokens": 1, "input": "say ok", "store": False}),
}


class _Instant(go._Instant):
    """The overhead benchmark's instant server, answering each protocol's path in its shape."""

    def answer(self, path: bytes) -> bytes:
        if path in _BODIES:
            return go._response(_BODIES[path])
        return super().answer(path)


def run_upstream(ports: list[int]) -> None:
    go.run_upstream(ports, _Instant)


def _raw(protocol: str, port: int, with_key: bool, i: int) -> bytes:
    path, body = _REQUESTS[protocol]
    payload = json.dumps(body).encode()
    auth = f"authorization: Bearer {go.API_KEY}\r\n".encode() if with_key else b""
    return (b"POST " + path + b" HTTP/1.1\r\nhost: 127.0.0.1:" + str(port).encode()
            + b"\r\ncontent-type: application/json\r\n" + auth + b"content-length: "
            + str(len(payload)).encode() + b"\r\n\r\n" + payload)


async def _latencies(protocol: str, port: int, with_key: bool, n: int) -> list[float]:
    rw = await go._conn(port)
    out = []
    try:
        for i in range(n):
            raw = _raw(protocol, port, with_key, i)
            t = time.perf_counter()
            status = await go._call(rw, raw)
            out.append(time.perf_counter() - t)
            if status != 200:
                raise RuntimeError(f"{protocol} on port {port} answered {status}")
    finally:
        rw[1].close()
    return out


async def _throughput(protocol: str, port: int, concurrency: int, duration_s: float) -> float:
    conns = [await go._conn(port) for _ in range(concurrency)]
    done = 0
    stop = time.perf_counter() + duration_s

    async def worker(rw: Any, w: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop:
            if await go._call(rw, _raw(protocol, port, True, w * 1_000_000 + i)) != 200:
                raise RuntimeError(f"{protocol} on port {port} failed under load")
            done += 1
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(rw, w) for w, rw in enumerate(conns)))
    elapsed = time.perf_counter() - t0
    for _, w in conns:
        w.close()
    return done / elapsed


CASES = {  # name -> (protocol, gateway, what the upstream receives: the direct baseline)
    "chat": ("chat", "native", "chat"),
    "messages": ("messages", "native", "messages"),
    "responses": ("responses", "native", "responses"),
    "messages_translated": ("messages", "translated", "chat"),
    "responses_translated": ("responses", "translated", "chat"),
}


async def measure(direct: int, gateways: dict[str, int], n_c1: int, rounds: int,
                  duration_s: float) -> dict[str, dict[str, float]]:
    for proto in _REQUESTS:
        await _latencies(proto, direct, False, 200)
    for proto, gw, _ in CASES.values():
        await _latencies(proto, gateways[gw], True, 300)
    d_lat: dict[str, list[float]] = {p: [] for p in _REQUESTS}
    g_lat: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(rounds):
        for proto in _REQUESTS:
            d_lat[proto] += await _latencies(proto, direct, False, n_c1 // rounds)
        for name, (proto, gw, _) in CASES.items():
            g_lat[name] += await _latencies(proto, gateways[gw], True, n_c1 // rounds)
    rps: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(2):
        for name, (proto, gw, _) in CASES.items():
            rps[name].append(await _throughput(proto, gateways[gw], 32, duration_s))
    return {name: {
        "p50_added_ms": (go._pct(g_lat[name], 0.5) - go._pct(d_lat[base], 0.5)) * 1e3,
        "p99_added_ms": (go._pct(g_lat[name], 0.99) - go._pct(d_lat[base], 0.99)) * 1e3,
        "p50_gateway_ms": go._pct(g_lat[name], 0.5) * 1e3,
        "p50_direct_ms": go._pct(d_lat[base], 0.5) * 1e3,
        "rps_c32": max(rps[name]),
        "requests_c1": len(g_lat[name]),
    } for name, (_, _, base) in CASES.items()}


def _config(tmp: Path, up_ports: list[int], gw_port: int, translated: bool) -> Path:
    path = go._config(tmp, up_ports, gw_port, "memory", "fast")
    cfg = json.loads(path.read_text())
    if translated:
        for b in cfg["backends"]:
            b["protocols"] = ["chat", "completions"]
        cfg["ledger"]["url"] = f"sqlite:///{tmp / 'ledger-translated.db'}"
    out = tmp / f"gateway-{'translated' if translated else 'native'}.yaml"
    out.write_text(json.dumps(cfg))
    return out


def verdict(result: dict[str, dict[str, float]]) -> dict[str, bool]:
    chat_rps = result["chat"]["rps_c32"]
    return {
        "native_p50_added_le_1ms": all(result[p]["p50_added_ms"] <= 1.0 for p in ("chat", "messages", "responses")),
        "native_rps_ge_0.8x_chat": all(result[p]["rps_c32"] >= 0.8 * chat_rps for p in ("messages", "responses")),
        "translated_p50_added_le_2ms": all(result[p]["p50_added_ms"] <= 2.0
                                           for p in ("messages_translated", "responses_translated")),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the numbers here")
    ap.add_argument("--requests", type=int, default=1200, help="requests per case at concurrency 1")
    ap.add_argument("--rounds", type=int, default=6, help="alternations of direct and gateway at c=1")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per throughput run at c=32")
    ap.add_argument("--upstream", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.upstream:
        run_upstream([int(p) for p in args.upstream.split(",")])
        return 0
    up_ports = [go._free_port(), go._free_port()]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        upstream = subprocess.Popen([sys.executable, __file__, "--upstream", ",".join(map(str, up_ports))])
        procs: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
        try:
            for name in ("native", "translated"):
                port = go._free_port()
                cfg = _config(tmp, up_ports, port, name == "translated")
                procs[name] = (port, subprocess.Popen(
                    [sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg), "--log-level", "warning"],
                    cwd=tmp, env={**os.environ, "PYTHONUNBUFFERED": "1"}))
            for p in up_ports:
                go._wait_port(p, upstream)
            for port, proc in procs.values():
                go._wait_port(port, proc)
            import uvloop

            result: dict[str, Any] = uvloop.run(measure(up_ports[0], {n: port for n, (port, _) in procs.items()},
                                                        args.requests, args.rounds, args.duration))
        finally:
            everything = [proc for _port, proc in procs.values()] + [upstream]
            for proc in everything:
                proc.send_signal(signal.SIGTERM)
            for proc in everything:
                proc.wait(30)
    result["targets"] = verdict(result)
    for name in CASES:
        r = result[name]
        print(f"{name:22s} p50 added {r['p50_added_ms']:6.3f} ms   req/s at c=32 {r['rps_c32']:8.0f}")
    print("targets:", json.dumps(result["targets"]))
    go.write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
