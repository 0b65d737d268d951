"""``tokenomy up``: a cluster file, 8 instances on this machine, clean stop without orphans."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from helpers.ports import free_port_base
from helpers.procs import group_members
from tokenomy.cli import main as cli_main
from tokenomy.emulator.cluster import DEFAULT_CLUSTER, expand, load_cluster


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _start_up(tmp_path: Path, *args: str, own_group: bool = False) -> tuple[subprocess.Popen[bytes], dict]:
    out = tmp_path / "cluster.json"
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli.up_cmd", *args, "--json", str(out)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=own_group)
    deadline = time.monotonic() + 90
    while not out.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"tokenomy up did not become ready (status {proc.poll()})")
        time.sleep(0.2)
    return proc, json.loads(out.read_text())


def test_default_cluster_is_four_mixed_llama_on_h100() -> None:
    insts = expand(DEFAULT_CLUSTER, 9000)
    assert [(i.role, i.model, i.gpu, i.port) for i in insts] == [("mixed", "llama-3.1-8b", "h100", 9000 + k)
                                                                 for k in range(4)]


def test_cluster_file_errors_name_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ("up_cmd",))  # the real parser, without the others
    main = cli_main.main
    bad = tmp_path / "c.yaml"
    bad.write_text("pools:\n  - role: both\n")
    with pytest.raises(ValueError, match=r"c.yaml: pools.0.role"):
        load_cluster(bad)
    assert main(["up", str(bad)]) == 2
    assert "c.yaml: pools.0.role" in capsys.readouterr().err
    assert main(["up", str(tmp_path / "missing.yaml")]) == 2
    bad.write_text("pools:\n  - role: decode\n    engine: {max_num_seq: 3}\n")
    assert main(["up", str(bad)]) == 2
    assert "unknown engine key(s) max_num_seq" in capsys.readouterr().err
    assert main(["up", "--json", str(tmp_path / "no" / "such.json")]) == 2
    assert "--json" in capsys.readouterr().err
    base = free_port_base(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base))
        assert main(["up", "--instances", "1", "--port-base", str(base)]) == 2
    assert f"port {base} on 127.0.0.1 is in use" in capsys.readouterr().err


@pytest.mark.integration
def test_eight_instances_serve_and_stop_cleanly_on_sigterm(tmp_path: Path) -> None:
    base = free_port_base(8)
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(f"port_base: {base}\nengine: {{max_num_seqs: 128}}\n"
                   "pools:\n  - {role: mixed, count: 4}\n  - {role: prefill, count: 2}\n  - {role: decode, count: 2}\n")
    proc, listing = _start_up(tmp_path, str(cfg))
    try:
        urls = [i["url"] for i in listing["instances"]]
        assert [i["role"] for i in listing["instances"]] == ["mixed"] * 4 + ["prefill"] * 2 + ["decode"] * 2
        children = _children(proc.pid)
        assert len(children) == 8

        def ask(url: str) -> int:
            r = httpx.post(url + "/v1/completions", json={"prompt": "hello " * 200, "max_tokens": 64,
                                                          "ignore_eos": True}, timeout=30)
            return r.json()["usage"]["completion_tokens"]

        with ThreadPoolExecutor(16) as pool:  # moderate load: two concurrent streams per instance
            assert list(pool.map(ask, urls * 2)) == [64] * 16
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert _wait_gone(children) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
@pytest.mark.parametrize("how", ["sigkill-up-only", "ctrl-c-to-the-group"])
def test_no_orphans_when_up_is_killed_or_interrupted(tmp_path: Path, how: str) -> None:
    proc, listing = _start_up(tmp_path, "--instances", "2", "--port-base", str(free_port_base(2)),
                              own_group=True)
    try:
        children = _children(proc.pid)
        assert len(children) == 2
        if how == "sigkill-up-only":
            os.kill(proc.pid, signal.SIGKILL)  # the kernel's parent-death signal stops the children
        else:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
            assert proc.wait(15) == 0
        proc.wait(15)
        assert _wait_gone(children) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.integration
@pytest.mark.parametrize("delay_s", [0.0, 0.5])
def test_sigterm_while_the_instances_start_stops_them_and_exits_130(delay_s: float) -> None:
    """At once, the signal lands as the first instance is forked (a child forked but not yet
    registered must still be stopped, and no further one started); half a second later, while the
    instances start up. Either way: exit status 130, a line that says so, no process left."""
    proc = subprocess.Popen([sys.executable, "-m", "tokenomy.cli.up_cmd", "--instances", "3",
                             "--port-base", str(free_port_base(3))],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(group_members(proc.pid)) < 2:  # up itself and its first instance
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.002)
        time.sleep(delay_s)  # where in the start-up the signal lands; the test waits on the process, not on time
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert "tokenomy up: interrupted while starting" in err and "Traceback" not in err
        assert group_members(proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in group_members(proc.pid):
            os.kill(pid, signal.SIGKILL)
