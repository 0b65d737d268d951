"""Starting real emulator processes on loopback for integration tests (always stopped)."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


def free_port_base(count: int = 1) -> int:
    """A base port with ``count`` consecutive free ports on 127.0.0.1."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not healthy after {timeout_s}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def emulators(*arg_lists: list[str]) -> Iterator[list[str]]:
    """Run one ``python -m tokenomy.emulator`` per argument list, started together on free ports;
    yields their base URLs once all are healthy, and stops them all."""
    base = free_port_base(len(arg_lists))
    procs = []
    try:
        for i, args in enumerate(arg_lists):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tokenomy.emulator", "--port", str(base + i), *args], stdin=subprocess.DEVNULL))
        urls = [f"http://127.0.0.1:{base + i}" for i in range(len(arg_lists))]
        for url, proc in zip(urls, procs, strict=True):
            wait_healthy(url, proc)
        yield urls
    finally:
        for proc in procs:
            stop(proc)


@contextmanager
def emulator(*args: str) -> Iterator[str]:
    """Run ``python -m tokenomy.emulator`` on a free port; yields its base URL."""
    with emulators(list(args)) as urls:
        yield urls[0]
