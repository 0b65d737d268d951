"""The fidelity benchmarks' reading of the machine (``benchmarks/_fidelity.py``): CPU in use by phase,
split into the benchmark's own process tree and everything else, read from a ``/proc`` tree."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

HZ = os.sysconf("SC_CLK_TCK")




def fake_proc(root: Path, uptime: float, cpu: dict[str, float], procs: dict[int, tuple[int, float, float]]) -> Path:
    """A ``/proc`` with ``stat`` (``cpu`` seconds by state), ``uptime`` and one ``PID/stat`` per
    ``procs`` entry (ppid, own seconds, reaped children's seconds)."""
    root.mkdir(parents=True, exist_ok=True)
    states = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    (root / "stat").write_text("cpu  " + " ".join(str(round(cpu.get(s, 0.0) * HZ)) for s in states)
                               + " 0 0\ncpu0 1 2 3 4\n")
    (root / "uptime").write_text(f"{uptime:.2f} 1.00\n")
    for pid, (ppid, own, children) in procs.items():
        (root / str(pid)).mkdir()
        ticks = round(own * HZ)
        # comm with a space and a parenthesis, as process names may have
        (root / str(pid) / "stat").write_text(
            f"{pid} (VLLM::Worker (x)) S {ppid} 1 1 0 -1 0 0 0 0 0 {ticks} 0 {round(children * HZ)} 0 20 0 1 0\n")
    (root / "self").mkdir()  # not a pid: skipped
    return root


def test_foreign_cpu_is_busy_time_less_the_benchmarks_process_tree(fidelity: ModuleType, tmp_path: Path) -> None:
    # pid 10 is the benchmark; 11 (tokenomy up) its child, 12 (the engine) a grandchild; 20 another user's job.
    a = fidelity.cpu_reading(fake_proc(tmp_path / "a", 100.0, {"user": 50, "nice": 5, "system": 10, "idle": 300},
                                       {10: (1, 1.0, 0.0), 11: (10, 0.5, 0.0), 12: (11, 20.0, 0.0), 20: (1, 5.0, 0.0)}),
                             root=10)
    # 10 s later: our tree used 12 s (engine 10, benchmark 1.5, one reaped helper 0.5); the other job 6 s niced;
    # the hypervisor took 1 s.
    b = fidelity.cpu_reading(fake_proc(tmp_path / "b", 110.0, {"user": 56, "nice": 11, "system": 16, "idle": 302,
                                                                "steal": 1},
                                       {10: (1, 2.5, 0.5), 11: (10, 0.5, 0.0), 12: (11, 30.0, 0.0), 20: (1, 11.0, 0.0)}),
                             root=10)
    assert a is not None and b is not None
    assert b.own_s - a.own_s == pytest.approx(12.0, abs=0.05)
    share = fidelity.machine_share(a, b)
    assert share == {"seconds": 10.0, "busy_cores": pytest.approx(1.8, abs=0.01),
                     "foreign_cores": pytest.approx(0.6, abs=0.01), "steal_cores": pytest.approx(0.1, abs=0.01)}


def test_no_reading_without_proc_and_no_share_without_two_readings(fidelity: ModuleType, tmp_path: Path) -> None:
    assert fidelity.cpu_reading(tmp_path / "missing") is None
    one = fidelity.cpu_reading(fake_proc(tmp_path / "p", 5.0, {"user": 1}, {10: (1, 1.0, 0.0)}), root=10)
    assert fidelity.machine_share(None, one) is None
    assert fidelity.machine_share(one, one) is None  # no time passed


def test_reads_this_machine(fidelity: ModuleType) -> None:
    if not Path("/proc/stat").is_file():
        pytest.skip("no /proc on this platform")
    a = fidelity.cpu_reading()
    assert a is not None and a.own_s > 0  # this test process has used CPU
