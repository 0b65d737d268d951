"""Start N gateway replicas (``python -m tokenomy.gateway``) on one config, for ``tokenomy up`` with
a fleet, the fleet tests and ``benchmarks/gateway_fleet.py``. Each replica is a child process,
stopped by ``stop`` (SIGTERM, then SIGKILL); ``kill`` SIGKILLs one (the fleet tests' crash)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Replica:
    port: int
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Replica:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tokenomy.gateway", "--config", str(self.config), "--port", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=1) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
                raise RuntimeError(f"gateway replica on port {self.port} exited:\n{tail}")
            if self.ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"gateway replica on port {self.port} not ready within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def start_replicas(config: Path, ports: list[int], log_dir: Path, timeout_s: float = 90.0) -> list[Replica]:
    """Start one replica per port (all at once) and wait until each answers; stop them all if one fails."""
    replicas = [Replica(p, config, log_dir / f"gateway-{p}.log").start() for p in ports]
    try:
        for r in replicas:
            r.wait_ready(timeout_s)
    except BaseException:
        stop_all(replicas)
        raise
    return replicas


def stop_all(replicas: list[Replica]) -> None:
    for r in replicas:
        with contextlib.suppress(Exception):
            r.stop()
