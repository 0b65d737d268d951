"""The live stack of ``tokenomy demo``: an emulated P/D cluster (``tokenomy up``'s launcher), the
gateway (``python -m tokenomy.gateway``) and an alert sink, on free loopback ports.

Every process it starts is its child, gets SIGTERM from the kernel if the demo dies (Linux
parent-death signal), and is stopped and reaped by :meth:`LiveStack.stop` (SIGTERM, then SIGKILL
after a grace period), which the demo calls from ``finally``: on success, on error and on Ctrl-C.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import httpx

from tokenomy.emulator.cluster import ClusterSpec, Instance, expand
from tokenomy.emulator.launcher import Interrupts, LaunchError, LocalCluster, parent_death_signal, port_free

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_base(count: int, host: str = HOST, tries: int = 50) -> int:
    """A port p with p .. p+count-1 all free (``tokenomy up`` numbers instances from a base)."""
    for _ in range(tries):
        base = free_port(host)
        if base + count <= 65535 and all(port_free(host, base + i) for i in range(count)):
            return base
    raise LaunchError(f"no {count} consecutive free ports on {host}")


class AlertSink:
    """A tiny HTTP server that keeps every JSON alert the gateway's webhook posts."""

    def __init__(self, host: str = HOST) -> None:
        self.alerts: list[dict[str, Any]] = []
        lock = threading.Lock()
        alerts = self.alerts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    alert = json.loads(body)
                except ValueError:
                    alert = None
                if isinstance(alert, dict):
                    with lock:
                        alerts.append(alert)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self._server.serve_forever, name="alert-sink", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()


def _wait(check: Callable[[], bool], alive: Callable[[], bool], what: str, timeout_s: float,
          stop: threading.Event) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if stop.is_set():
            raise LaunchError(f"interrupted while starting {what}")
        if not alive():
            raise LaunchError(f"{what} exited while starting (see its log)")
        if time.monotonic() > deadline:
            raise LaunchError(f"{what} not ready after {timeout_s:g}s")
        stop.wait(0.2)


class LiveStack:
    """Cluster + gateway + alert sink. ``start`` brings the cluster up, then the gateway with the
    config ``make_config(backends, alert_url)`` returns; ``stop`` ends everything it started."""

    def __init__(self, spec: ClusterSpec, workdir: Path, *, ready_timeout_s: float = 60.0) -> None:
        self.workdir = workdir.resolve()  # the gateway runs in it: a relative --config would miss
        self.ready_timeout_s = ready_timeout_s
        self.instances: list[Instance] = expand(spec, free_port_base(sum(p.count for p in spec.pools), spec.host))
        self.gateway_port = free_port(spec.host)
        self.gateway_url = f"http://{spec.host}:{self.gateway_port}"
        self.sink = AlertSink(spec.host)
        self.cluster: LocalCluster | None = None
        self.gateway: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []

    @property
    def ports(self) -> list[int]:
        return [i.port for i in self.instances] + [self.gateway_port]

    def pids(self) -> list[int]:
        procs = ([] if self.cluster is None else self.cluster.procs) + ([self.gateway] if self.gateway else [])
        return [p.pid for p in procs]

    def _log(self, name: str) -> IO[bytes]:
        fh = open(self.workdir / name, "wb")  # noqa: SIM115 (closed in stop)
        self._logs.append(fh)
        return fh

    def start(self, make_config: Callable[[list[dict[str, str]], str], dict[str, Any]],
              interrupts: Interrupts) -> None:
        stop = interrupts.stop
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sink.start()
        log = self._log("cluster.log")
        self.cluster = LocalCluster(self.instances, ready_timeout_s=self.ready_timeout_s,
                                    stdout=log.fileno(), stderr=log.fileno(), interrupts=interrupts)
        self.cluster.start()
        self.cluster.wait_ready()
        backends = [{"id": i.instance_id, "url": i.url, "role": i.role} for i in self.instances]
        config = make_config(backends, self.sink.url)
        config.setdefault("server", {})["port"] = self.gateway_port
        path = self.workdir / "gateway.yaml"
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        glog = self._log("gateway.log")
        with interrupts.spawning():
            self.gateway = subprocess.Popen(
                [sys.executable, "-m", "tokenomy.gateway", "--config", str(path), "--log-level", "warning"],
                stdin=subprocess.DEVNULL, stdout=glog.fileno(), stderr=glog.fileno(), cwd=self.workdir,
                preexec_fn=parent_death_signal(),
            )
        gateway = self.gateway

        def healthy() -> bool:
            try:
                return httpx.get(self.gateway_url + "/health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(healthy, lambda: gateway.poll() is None, "the gateway", self.ready_timeout_s, stop)

    def scrape_engines(self) -> dict[str, dict[str, float]]:
        """Each instance's ``/metrics`` (vLLM names and ours), summed over labels; {} for one that
        does not answer."""
        from tokenomy.gateway.routing.backends import parse_prometheus

        out: dict[str, dict[str, float]] = {}
        with httpx.Client(timeout=5.0) as client:
            for inst in self.instances:
                try:
                    out[inst.instance_id] = parse_prometheus(client.get(inst.url + "/metrics").text)
                except httpx.HTTPError:
                    out[inst.instance_id] = {}
        return out

    def stop_gateway(self, grace_s: float = 10.0) -> None:
        """SIGTERM the gateway (it posts queued alerts and closes its ledger), SIGKILL after ``grace_s``."""
        gw = self.gateway
        if gw is None:
            return
        if gw.poll() is None:
            gw.send_signal(signal.SIGTERM)
        try:
            gw.wait(grace_s)
        except subprocess.TimeoutExpired:
            gw.kill()
            gw.wait()

    def stop(self) -> None:
        """Stop the gateway, then the engines, then the sink; safe to call twice."""
        try:
            self.stop_gateway()
        finally:
            try:
                if self.cluster is not None:
                    self.cluster.stop()
            finally:
                self.sink.stop()
                for fh in self._logs:
                    fh.close()
                self._logs.clear()


__all__ = ["AlertSink", "LiveStack", "free_port", "free_port_base"]
