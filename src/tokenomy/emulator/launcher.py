"""Starting and stopping a local emulated cluster: one ``python -m tokenomy.emulator`` per instance.

Used by ``tokenomy up`` and by scripts (benchmarks) that need a cluster for a while::

    with LocalCluster(expand(DEFAULT_CLUSTER, port_base=9000)) as cluster:
        urls = [i.url for i in cluster.instances]

Children run in the caller's process group (unless their launch asks for a group of their own)
and get SIGTERM from the kernel if the caller dies (Linux parent-death signal), so none
outlives it. What each instance runs is a :class:`Launch` (default: the emulator); real vLLM
instances come from :func:`tokenomy.vllm.launch.vllm_launcher`, which runs each in a process group
of its own (vLLM forks engine processes) and logs it to a file. A program that stops on
SIGINT/SIGTERM hands the cluster its :class:`Interrupts` (``tokenomy up``, ``tokenomy demo``): a
signal that lands while a child is forked is then held until the child is registered, so ``stop``
still reaches it, and no further instance is started.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
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


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for ports it hands out by itself (bind to 0, a client's local port)."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def quiet_port(host: str, avoid: Collection[int] = ()) -> int:
    """A port free on ``host`` now, for a server that binds it only later, chosen below the kernel's
    ephemeral range: a port from bind(0), closed again, can be handed meanwhile to another process's
    socket (seen with vLLM's NIXL side channel, bound after the model loads: "Address already in
    use"); a port the kernel never hands out races only with other explicit choices."""
    low, _ = ephemeral_ports()
    rng = random.Random()
    if low > 12_000:
        for _ in range(500):
            port = rng.randrange(10_000, low)
            if port not in avoid and port_free(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no quiet range: the OS's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])


def parent_death_signal() -> Callable[[], None] | None:
    """A pre-exec hook that makes the child get SIGTERM when its parent dies (Linux only)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: stop() and Ctrl-C still stop children
        return None

    def hook() -> None:  # runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return hook


@dataclass(frozen=True)
class Launch:
    """How one instance's process starts.

    ``env``: the child's whole environment (None: this process's). ``log_path``: its stdout and
    stderr go there (None: stdout and stderr are inherited, stderr as the cluster says).
    ``own_group``: the child leads a process group of its own, and :meth:`LocalCluster.stop`
    signals the whole group (for servers that fork workers). ``stop_grace_s``: how long a
    SIGTERM may take before SIGKILL.
    """

    argv: list[str]
    env: dict[str, str] | None = None
    log_path: Path | None = None
    own_group: bool = False
    stop_grace_s: float = 5.0


def emulator_launch(inst: Instance) -> Launch:
    """``python -m tokenomy.emulator`` with the instance's flags."""
    return Launch([sys.executable, "-m", "tokenomy.emulator", *inst.argv()])


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
                 launch: Callable[[Instance], Launch] = emulator_launch,
                 interrupts: Interrupts | None = None) -> None:
        self.instances = instances
        self.ready_timeout_s = ready_timeout_s
        self._stderr = stderr
        self._stdout = stdout
        self._launch = launch
        self.launches: list[Launch] = []
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
            spec = self._launch(inst)
            with self.interrupts.spawning():
                if spec.log_path is None:
                    proc = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=self._stdout,
                                            stderr=self._stderr, env=spec.env, preexec_fn=hook,
                                            start_new_session=spec.own_group)
                else:
                    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
                    with spec.log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
                        proc = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, env=spec.env, preexec_fn=hook,
                                                start_new_session=spec.own_group)
                self.procs.append(proc)
                self.launches.append(spec)

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
                    raise LaunchError(f"instance {inst.instance_id} (port {inst.port}) exited with status {rc}"
                                      + self._log_hint(inst))
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
                        raise LaunchError(f"{len(pending)} instance(s) not healthy after {self.ready_timeout_s:g}s"
                                          + self._log_hint(pending[0]))
                    stop.wait(0.2)

    def _log_hint(self, inst: Instance) -> str:
        i = self.instances.index(inst)
        path = self.launches[i].log_path if i < len(self.launches) else None
        return f" (log: {path})" if path is not None else ""

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM every instance (its group, for ``own_group``), SIGKILL those still running after
        the grace (``grace_s``, else each launch's ``stop_grace_s``), and reap them (a signal
        meanwhile does not cut this short)."""
        with self.interrupts.deferred():
            self._stop(grace_s)

    def _stop(self, grace_s: float | None) -> None:
        for p, spec in zip(self.procs, self.launches, strict=True):
            if p.poll() is None:
                _signal(p, spec, signal.SIGTERM)
        grace = grace_s if grace_s is not None else max((s.stop_grace_s for s in self.launches), default=5.0)
        deadline = time.monotonic() + grace
        for p, spec in zip(self.procs, self.launches, strict=True):
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(p, spec, signal.SIGKILL)
                p.wait()
            if spec.own_group:  # workers the leader left behind
                _signal(p, spec, signal.SIGKILL)


def _signal(p: subprocess.Popen[bytes], spec: Launch, sig: int) -> None:
    try:
        if spec.own_group:
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
    except ProcessLookupError:
        pass
