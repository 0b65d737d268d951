"""Starting and stopping a local emulated cluster: one ``python -m tokenomy.emulator`` per instance.

Used by ``tokenomy up`` and by scripts (benchmarks) that need a cluster for a while::

    with LocalCluster(expand(DEFAULT_CLUSTER, port_base=9000)) as cluster:
        urls = [i.url for i in cluster.instances]

Children get SIGTERM from the kernel if the caller dies (Linux parent-death signal), so none
outlives it. What each instance runs is a :class:`Launch` (default: the emulator); real vLLM
instances come from :func:`tokenomy.vllm.launch.vllm_launcher`, which runs each in a process group
of its own (vLLM forks engine processes) and logs it to a file.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

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


def _parent_death_signal() -> Callable[[], None] | None:
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


class LocalCluster:
    """The instance processes of a cluster; a context manager that starts, waits and stops them."""

    def __init__(self, instances: list[Instance], *, ready_timeout_s: float = 60.0,
                 stderr: int | None = None, launch: Callable[[Instance], Launch] = emulator_launch) -> None:
        self.instances = instances
        self.ready_timeout_s = ready_timeout_s
        self._stderr = stderr
        self._launch = launch
        self.launches: list[Launch] = []
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
        hook = _parent_death_signal()
        for inst in self.instances:
            spec = self._launch(inst)
            self.launches.append(spec)
            if spec.log_path is None:
                self.procs.append(subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stderr=self._stderr,
                                                   env=spec.env, preexec_fn=hook, start_new_session=spec.own_group))
                continue
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            with spec.log_path.open("ab") as log:  # the child keeps its own copy of the descriptor
                self.procs.append(subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=log,
                                                   stderr=subprocess.STDOUT, env=spec.env, preexec_fn=hook,
                                                   start_new_session=spec.own_group))

    def dead(self) -> list[tuple[Instance, int]]:
        """Instances whose process exited, with their exit status."""
        return [(i, p.returncode) for i, p in zip(self.instances, self.procs, strict=True)
                if p.poll() is not None]

    def wait_ready(self, stop: threading.Event | None = None) -> None:
        """Block until every ``/health`` answers 200; LaunchError if one dies or time runs out."""
        import httpx

        stop = stop or threading.Event()
        deadline = time.monotonic() + self.ready_timeout_s
        pending = list(self.instances)
        with httpx.Client(timeout=1.0) as client:
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
        the grace (``grace_s``, else each launch's ``stop_grace_s``), and reap them."""
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
