"""What the gateway adds: latency at concurrency 1 and throughput at concurrency 32, side by side.

An instant upstream (a bare asyncio HTTP server answering a fixed chat completion with usage) runs
in its own process; the gateway runs as ``tokenomy serve`` in another, in its default
configuration with every feature on: key auth (a seeded ``tk-`` key), RPM/TPM limits, budget
reservations (in memory, the default; ``--reservations sql`` for holds in SQLite), breakers, the
SQLite ledger, and session-affinity routing over two backend entries. Priority admission is off,
as by default (it queues only past ``admission.max_in_flight``). The load generator in this
process speaks raw HTTP/1.1 over keep-alive connections (so the client costs little) and
alternates direct and gateway rounds, so both see the same machine state. It also reports the
gateway process's CPU time per request (user + system, from /proc), a far steadier figure than
latency on a shared machine.

    python benchmarks/gateway_overhead.py --json out/gateway_overhead.json
    python benchmarks/gateway_overhead.py --clients fast,aiohttp   # the hot-path clients side by side

Writes ``{"p50_added_ms_c1", "p99_added_ms_c1", "rps_c32", "rps_direct_c32", ...}``.
Targets (issue 9): p50 added <= 1 ms at c=1; >= 1000 req/s at c=32.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "llama-3.1-8b"  # the default config's model (what `tokenomy up` serves)
API_KEY = "tk-" + "b" * 43  # a fixed benchmark key (tk- + 43 urlsafe characters, as `tokenomy keys` makes)

_COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13,
              "prompt_tokens_details": {"cached_tokens": 0}},
}).encode()


def _response(body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\ncontent-length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)


class _Instant(asyncio.Protocol):
    """HTTP/1.1 keep-alive server that answers every request at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            i = head.find(b"content-length:")
            n = int(head[i + 15:].split(b"\r\n", 1)[0]) if i >= 0 else 0
            if len(self.buf) < end + 4 + n:
                return
            path = head.split(b" ", 2)[1]
            self.buf = self.buf[end + 4 + n:]
            self.t.write(self.answer(path))  # type: ignore[attr-defined]

    def answer(self, path: bytes) -> bytes:
        if path == b"/health":
            return _response(b'{"status":"ok"}')
        if path == b"/metrics":
            return _response(b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
                             b"vllm:kv_cache_usage_perc 0.1\n", b"text/plain")
        return _response(_COMPLETION)


def run_upstream(ports: list[int], server: type[asyncio.Protocol] = _Instant) -> None:
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for p in ports:
            await loop.create_server(server, "127.0.0.1", p)
        await asyncio.Event().wait()

    uvloop.run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _conn(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _call(rw: tuple[asyncio.StreamReader, asyncio.StreamWriter], raw: bytes) -> int:
    reader, writer = rw
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    low = head.lower()
    i = low.find(b"content-length:")
    n = int(low[i + 15:].split(b"\r\n", 1)[0])
    await reader.readexactly(n)
    return int(head[9:12])


def _request(port: int, with_key: bool, i: int) -> bytes:
    body = json.dumps({"model": MODEL, "max_tokens": 1,
                       "messages": [{"role": "user", "content": f"say ok #{i}"}]}).encode()
    auth = f"authorization: Bearer {API_KEY}\r\n".encode() if with_key else b""
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:" + str(port).encode()
            + b"\r\ncontent-type: application/json\r\n" + auth + b"content-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


async def _latencies(port: int, with_key: bool, n: int) -> list[float]:
    rw = await _conn(port)
    out = []
    try:
        for i in range(n):
            raw = _request(port, with_key, i)
            t = time.perf_counter()
            status = await _call(rw, raw)
            out.append(time.perf_counter() - t)
            if status != 200:
                raise RuntimeError(f"port {port} answered {status}")
    finally:
        rw[1].close()
    return out


async def _throughput(port: int, with_key: bool, concurrency: int, duration_s: float) -> float:
    conns = [await _conn(port) for _ in range(concurrency)]
    done = 0
    stop = time.perf_counter() + duration_s

    async def worker(rw: tuple[asyncio.StreamReader, asyncio.StreamWriter], w: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop:
            status = await _call(rw, _request(port, with_key, w * 1_000_000 + i))
            if status != 200:
                raise RuntimeError(f"port {port} answered {status}")
            done += 1
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(rw, w) for w, rw in enumerate(conns)))
    elapsed = time.perf_counter() - t0
    for _, w in conns:
        w.close()
    return done / elapsed


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _config(tmp: Path, up_ports: list[int], gw_port: int, reservations: str = "memory",
            client: str = "fast") -> Path:
    cfg = {
        "server": {"host": "127.0.0.1", "port": gw_port, "upstream_client": client},
        "backends": [{"id": f"up{i}", "url": f"http://127.0.0.1:{p}"} for i, p in enumerate(up_ports)],
        "router": {"name": "session_affinity"},
        "ledger": {"url": f"sqlite:///{tmp / f'ledger-{client}.db'}"},
        "ops": {
            "server_secret": "bench-secret-0123456789",
            "admin_key": "bench-admin-0123456789",
            "reservations": reservations,
            "tenants": [{
                "org": "bench", "limits": {"rpm": 10_000_000, "tpm": 10_000_000_000, "budget_usd": 1e9},
                "teams": [{"name": "load", "keys": [{"name": "k1", "key": API_KEY}]}],
            }],
        },
    }
    path = tmp / f"gateway-{client}.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout_s}s")


def write_json(result: dict[str, Any], path: str | None) -> None:
    """``result`` to ``path`` (its folder made), when one is given."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(direct: int, gateways: dict[str, tuple[int, int]], n_c1: int, rounds: int,
                  duration_s: float) -> dict[str, dict[str, float]]:
    """Per gateway (name -> (port, pid)): added latency at c=1, throughput at c=32, CPU per
    request. Direct and every gateway alternate round by round, so all see the same machine."""
    await _latencies(direct, False, 200)  # warm every path
    cpu_ms: dict[str, float] = {}
    for name, (port, pid) in gateways.items():
        await _latencies(port, True, 500)
        cpu0 = _cpu_s(pid)
        n_cpu = await _latencies(port, True, 1000)
        cpu_ms[name] = (_cpu_s(pid) - cpu0) / len(n_cpu) * 1e3
    d_lat: list[float] = []
    g_lat: dict[str, list[float]] = {name: [] for name in gateways}
    for _ in range(rounds):
        d_lat += await _latencies(direct, False, n_c1 // rounds)
        for name, (port, _pid) in gateways.items():
            g_lat[name] += await _latencies(port, True, n_c1 // rounds)
    rps_d: list[float] = []
    rps_g: dict[str, list[float]] = {name: [] for name in gateways}
    cpu_c32_s = dict.fromkeys(gateways, 0.0)
    served_c32 = dict.fromkeys(gateways, 0.0)
    for _ in range(2):
        rps_d.append(await _throughput(direct, False, 32, duration_s))
        for name, (port, pid) in gateways.items():
            cpu0 = _cpu_s(pid)
            rps_g[name].append(await _throughput(port, True, 32, duration_s))
            cpu_c32_s[name] += _cpu_s(pid) - cpu0
            served_c32[name] += rps_g[name][-1] * duration_s
    return {name: {
        "p50_added_ms_c1": (_pct(g_lat[name], 0.5) - _pct(d_lat, 0.5)) * 1e3,
        "p99_added_ms_c1": (_pct(g_lat[name], 0.99) - _pct(d_lat, 0.99)) * 1e3,
        "p50_gateway_ms_c1": _pct(g_lat[name], 0.5) * 1e3,
        "p50_direct_ms_c1": _pct(d_lat, 0.5) * 1e3,
        "rps_c32": max(rps_g[name]),
        "rps_direct_c32": max(rps_d),
        "requests_c1": len(g_lat[name]),
        "gateway_cpu_ms_per_request": cpu_ms[name],  # at c=1: the steadiest figure on a busy machine
        "gateway_cpu_ms_per_request_c32": cpu_c32_s[name] / served_c32[name] * 1e3,
    } for name in gateways}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the numbers here")
    ap.add_argument("--requests", type=int, default=3000, help="requests per path at concurrency 1")
    ap.add_argument("--rounds", type=int, default=6, help="alternations of direct and gateway at c=1")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per throughput run at c=32")
    ap.add_argument("--reservations", default="memory", choices=["sql", "memory"],
                    help="where budget holds live (memory: the default, spend rebuilt from the ledger; sql: shared by processes)")
    ap.add_argument("--clients", default="fast",
                    help="hot-path upstream clients to run side by side, comma-separated (fast, aiohttp); "
                         "the first one's numbers are the top-level keys")
    ap.add_argument("--upstream", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.upstream:
        run_upstream([int(p) for p in args.upstream.split(",")])
        return 0
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if not clients or any(c not in ("fast", "aiohttp") for c in clients) or len(set(clients)) < len(clients):
        ap.error(f"--clients: distinct names among fast, aiohttp; got {args.clients!r}")
    up_ports = [_free_port(), _free_port()]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        upstream = subprocess.Popen([sys.executable, __file__, "--upstream", ",".join(map(str, up_ports))])
        procs: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
        try:
            for client in clients:
                port = _free_port()
                cfg = _config(tmp, up_ports, port, args.reservations, client)
                procs[client] = (port, subprocess.Popen(
                    [sys.executable, "-m", "tokenomy.gateway", "--config", str(cfg), "--log-level", "warning"],
                    cwd=tmp, env={**os.environ, "PYTHONUNBUFFERED": "1"}))
            for p in up_ports:
                _wait_port(p, upstream)
            for port, proc in procs.values():
                _wait_port(port, proc)
            import uvloop

            per_client = uvloop.run(measure(up_ports[0], {c: (port, proc.pid) for c, (port, proc) in procs.items()},
                                            args.requests, args.rounds, args.duration))
        finally:
            everything = [proc for _port, proc in procs.values()] + [upstream]
            for proc in everything:
                proc.send_signal(signal.SIGTERM)
            for proc in everything:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    result: dict[str, Any] = dict(per_client[clients[0]])
    result["upstream_client"] = clients[0]
    result["reservations"] = args.reservations
    result["load_avg_1m"] = os.getloadavg()[0]
    for k, v in result.items():
        print(f"{k:>20}: {v:.3f}" if isinstance(v, float) else f"{k:>20}: {v}")
    if len(clients) > 1:
        result["clients"] = per_client
        for k in per_client[clients[0]]:
            print(f"{k:>32}: " + "  ".join(f"{c} {per_client[c][k]:.3f}" for c in clients))
    write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
