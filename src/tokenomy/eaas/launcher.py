"""Start and stop expert server processes (``python -m tokenomy.eaas.server``) from Python.

Used by tests, benchmarks and ``tokenomy eaas demo``. Every wait is bounded; ``stop`` always ends
the process (SIGTERM, then SIGKILL), so a failing caller never leaves servers behind.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO


@dataclass
class ServerProcess:
    """A running expert server. ``address`` is what it actually bound (real port, not :0)."""

    server_id: str
    expert_ids: tuple[int, ...]
    address: str
    proc: subprocess.Popen[str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, wait: bool = True) -> None:
        """SIGKILL: the failure the failover path must survive. ``wait=False`` returns at once (a
        benchmark must not time the kernel's teardown of the process); ``stop`` reaps it later."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        if wait:
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Graceful stop with a bounded wait, then SIGKILL."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _command(server_id: str, expert_ids: Iterable[int], bind: str, preset: str, seed: int,
             weights: Path | None, expert_file: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "tokenomy.eaas.server", "--bind", bind, "--server-id", server_id,
           "--experts", ",".join(map(str, expert_ids))]
    if expert_file is not None:
        return cmd + ["--expert-file", str(expert_file)]
    cmd += ["--preset", preset, "--seed", str(seed)]
    return cmd + (["--weights", str(weights)] if weights is not None else [])


def start_servers(placement: Mapping[str, Sequence[int]], *, preset: str = "deepseek-tiny", seed: int = 0,
                  weights: Path | None = None, expert_file: Path | None = None, bind: str = "tcp://127.0.0.1:0",
                  ready_timeout_s: float = 60.0) -> list[ServerProcess]:
    """Start one server per ``placement`` entry (server id -> expert ids) in parallel; wait for READY.

    Weights: a model's expert checkpoint (``expert_file``, ids are its keys), else the block
    ``preset`` from ``weights`` or ``seed``. ``bind`` is shared by all servers: ``tcp://127.0.0.1:0`` gives each a free port; an ipc address
    must contain ``{server_id}`` (e.g. ``ipc:///tmp/run/{server_id}.sock``) so each gets its own path.

    On any failure every process started here is stopped before the error propagates.
    """
    if bind.startswith("ipc://") and "{server_id}" not in bind and len(placement) > 1:
        raise ValueError(f"ipc bind {bind!r} is shared by {len(placement)} servers; put {{server_id}} in it")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs: dict[str, subprocess.Popen[str]] = {}
    errlogs: dict[str, IO[str]] = {}
    started: list[ServerProcess] = []
    try:
        for sid, ids in placement.items():
            # stderr to a file, not a pipe: nobody drains it after start-up, and a full pipe would block.
            errlog: IO[str] = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in finally
            cmd = _command(sid, ids, bind.replace("{server_id}", sid), preset, seed, weights, expert_file)
            procs[sid] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errlog, text=True, env=env)
            errlogs[sid] = errlog
        deadline = time.monotonic() + ready_timeout_s
        for sid, proc in procs.items():
            line = _read_line(proc, deadline)
            parts = line.split()
            if len(parts) < 3 or parts[0] != "READY":
                if not line:  # EOF: the process is exiting; let it finish writing stderr
                    proc.wait(timeout=10)
                errlogs[sid].seek(0)
                err = errlogs[sid].read()
                raise RuntimeError(f"expert server {sid} did not start: {line.strip() or err.strip()[-500:]}")
            started.append(ServerProcess(sid, tuple(placement[sid]), parts[1], proc))
    except BaseException:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        raise
    finally:
        for errlog in errlogs.values():
            errlog.close()  # the child keeps its own descriptor
    return started


def _read_line(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
            raise TimeoutError(f"expert server pid {proc.pid} sent no READY line in time")
    return proc.stdout.readline()


def stop_all(servers: Iterable[ServerProcess]) -> None:
    """Stop every server; never raises for one that is already gone."""
    for s in servers:
        s.stop()
