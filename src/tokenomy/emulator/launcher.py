"""Starting and stopping a local emulated cluster: one ``python -m tokenomy.emulator`` per instance.

Used by ``tokenomy up`` and by scripts (benchmarks) that need a cluster for a while::

    with LocalCluster(expand(DEFAULT_CLUSTER, port_base=9000)) as cluster:
        urls = [i.url for i in cluster.instances]

Children run in the caller's process group and get SIGTERM from the kernel if the caller dies
(Linux parent-death signal), so none outlives it. A program that stops on SIGINT/SIGTERM hands
the cluster its :class:`Interrupts` (``tokenomy up``, ``tokenomy demo``): a signal that lands while a
child is forked is then held until the child is registered, so ``stop`` still reaches it, and no
further instance is started.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from tokenomy.emulator.cluster import Instance

_PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """An instance could not start, or died."""


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def parent_death_signal() -> Callable[[], None] | None:
    """A pre-exec hook that makes the child get SIGTERM when its parent dies (Linux only)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: stop() and Ctrl-C still stop children
        return None

    def hook() -> None:  # runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return hook


class Interrupts:
    """SIGINT (Ctrl-C) and SIGTERM set ``stop`` and, while :meth:`installed`, raise KeyboardInterrupt
    in the main thread — except inside :meth:`deferred`: there the signal only sets ``stop``.

    :meth:`spawning` is the deferred section around forking a child and registering it: a
    KeyboardInterrupt there would leave a child nobody stops (or fire in an at-fork hook, where
    Python ignores it), so it is raised when the section ends. Cleanup that must not be cut short
    (stopping the children) and a main loop that polls ``stop`` run ``deferred`` too.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._deferred = 0
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop.set()
        if not self._deferred:
            raise KeyboardInterrupt

    def install(self) -> None:
        """Handle SIGINT and SIGTERM (main thread) until :meth:`restore`."""
        for s in (signal.SIGINT, signal.SIGTERM):
            self._previous.setdefault(s, signal.signal(s, self._on_signal))

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        while self._previous:
            signal.signal(*self._previous.popitem())

    @contextmanager
    def installed(self) -> Iterator[None]:
        self.install()
        try:
            yield
        finally:
            self.restore()

    @contextmanager
    def deferred(self) -> Iterator[None]:
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1

    @contextmanager
    def spawning(self) -> Iterator[None]:
        """Fork and register a child in here; KeyboardInterrupt at the end if a signal came."""
        with self.deferred():
            yield
        if self.stop.is_set():
            raise KeyboardInterrupt


class LocalCluster:
    """The instance processes of a cluster; a context manager that starts, waits and stops them.

    With ``interrupts`` (installed by the caller), ``start`` forks each instance in
    :meth:`Interrupts.spawning` and raises KeyboardInterrupt once a signal came, after registering
    the child being forked and starting no further one; ``wait_ready`` stops on its ``stop``.
    """

    def __init__(self, instances: list[Instance], *, ready_timeout_s: float = 60.0,
                 stderr: int | None = None, stdout: int | None = None,
                 interrupts: Interrupts | None = None) -> None:
        self.instances = instances
        self.ready_timeout_s = ready_timeout_s
        self._stderr = stderr
        self._stdout = stdout
        self.interrupts = interrupts or Interrupts()  # not installed: a no-op unless the caller's is
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Spawn every instance (ValueError if a port is taken)."""
        for inst in self.instances:
            if not port_free(inst.host, inst.port):
                raise ValueError(f"port {inst.port} on {inst.host} is in use (choose another --port-base)")
        hook = parent_death_signal()
        for inst in self.instances:
            cmd = [sys.executable, "-m", "tokenomy.emulator", *inst.argv()]
            with self.interrupts.spawning():
                self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._stdout,
                                                   stderr=self._stderr, preexec_fn=hook))

    def dead(self) -> list[tuple[Instance, int]]:
        """Instances whose process exited, with their exit status."""
        return [(i, p.returncode) for i, p in zip(self.instances, self.procs, strict=True)
                if p.poll() is not None]

    def wait_ready(self, stop: threading.Event | None = None) -> None:
        """Block until every ``/health`` answers 200; LaunchError if one dies or time runs out."""
        import httpx

        stop = stop or self.interrupts.stop
        deadline = time.monotonic() + self.ready_timeout_s
        pending = list(self.instances)
        with self.interrupts.spawning():  # the first client imports httpcore, whose trio import runs
            client = httpx.Client(timeout=1.0)  # `ldconfig -p` (ctypes.util.find_library): a child too
        with client:
            while pending:
                if stop.is_set():
                    raise LaunchError("interrupted while starting")
                for inst, rc in self.dead():
                    raise LaunchError(f"instance {inst.instance_id} (port {inst.port}) exited with status {rc}")
                still = []
                for inst in pending:
                    try:
                        ok = client.get(inst.url + "/health").status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    if not ok:
                        still.append(inst)
                pending = still
                if pending:
                    if time.monotonic() > deadline:
                        raise LaunchError(f"{len(pending)} instance(s) not healthy after {self.ready_timeout_s:g}s")
                    stop.wait(0.2)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every instance, SIGKILL those still running after ``grace_s``, and reap them
        (a signal meanwhile does not cut this short)."""
        with self.interrupts.deferred():
            self._stop(grace_s)

    def _stop(self, grace_s: float) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
