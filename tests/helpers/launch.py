"""Server processes an integration test starts on loopback: started, waited for, always stopped."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx

from helpers.polling import wait_for
from helpers.ports import free_port_base


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``timeout_s``; waits for the exit."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until(check: Callable[[], object], proc: subprocess.Popen[bytes], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``check()`` every 0.1 s (an HTTP or OS error counts as "not yet") until it is truthy;
    ``RuntimeError`` when ``proc`` exits first, ``AssertionError`` after ``timeout_s``."""

    def ready() -> object:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError):
            return check()
        return False

    wait_for(ready, timeout_s, interval_s=0.1, what=what)


def healthy(url: str) -> Callable[[], bool]:
    """A check for :func:`wait_until`: ``GET url/health`` answers 200."""
    return lambda: httpx.get(url + "/health", timeout=2.0).status_code == 200


@contextmanager
def started(argv: list[str], **popen: Any) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running (stdin closed) for the ``with`` block, stopped after it whatever happens."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **popen)
    try:
        yield proc
    finally:
        stop(proc)


@contextmanager
def serving(argv: list[str], url: str, what: str, timeout_s: float = 60.0, **popen: Any) -> Iterator[None]:
    """``argv``, a server at ``url``, running and healthy (``/health``) for the ``with`` block."""
    with started(argv, **popen) as proc:
        wait_until(healthy(url), proc, what, timeout_s)
        yield


@contextmanager
def emulators(*arg_lists: list[str], timeout_s: float = 60.0) -> Iterator[list[str]]:
    """One ``python -m tokenomy.emulator`` per argument list, started together on free ports;
    yields their base URLs once all are healthy, and stops them all."""
    base = free_port_base(len(arg_lists))
    urls = [f"http://127.0.0.1:{base + i}" for i in range(len(arg_lists))]
    with ExitStack() as stack:
        procs = [stack.enter_context(started([sys.executable, "-m", "tokenomy.emulator", "--port", str(base + i),
                                              *args]))
                 for i, args in enumerate(arg_lists)]
        for url, proc in zip(urls, procs, strict=True):
            wait_until(healthy(url), proc, f"the emulator at {url}", timeout_s)
        yield urls


@contextmanager
def emulator(*args: str, timeout_s: float = 60.0) -> Iterator[str]:
    """``python -m tokenomy.emulator ARGS`` on a free port; yields its base URL once healthy."""
    with emulators(list(args), timeout_s=timeout_s) as urls:
        yield urls[0]
