"""Start and stop emulator processes for the benchmarks (not part of the library)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url}: not healthy after {timeout_s} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def emulator(args: list[str]) -> Iterator[str]:
    """``tokenomy emulate ARGS`` on a free loopback port; yields its URL, always stops it."""
    port = free_port()
    cmd = [sys.executable, "-m", "tokenomy.emulator", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        _stop(proc)


@contextmanager
def cluster(args: list[str], timeout_s: float = 180.0) -> Iterator[list[str]]:
    """``tokenomy up ARGS`` on free ports; yields the instance URLs it reports, always stops it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "up.json"
        cmd = [sys.executable, "-m", "tokenomy.cli.main", "up", "--port-base", str(free_port()),
               "--json", str(out), "--ready-timeout", str(timeout_s), *args]
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + timeout_s + 10
            while not out.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tokenomy up did not start (status {proc.poll()})")
                time.sleep(0.5)
            time.sleep(0.2)  # the file is written whole, then renamed; give the rename a moment
            listing = json.loads(out.read_text())
            items = listing["instances"] if isinstance(listing, dict) else listing
            yield [i["url"] for i in items]
        finally:
            _stop(proc)
