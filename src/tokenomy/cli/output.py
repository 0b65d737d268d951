"""What the sim commands print besides tables: the workload header and progress lines."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.markup import escape

from tokenomy.experiment import RunResult
from tokenomy.workload import WorkloadInfo


def print_workload(console: Console, info: WorkloadInfo) -> None:
    """``workload X [format, detected]: N of N requests ..., span`` and one ``note:`` per cut."""
    how = "detected" if info.detected else "given"
    fmt = info.format if info.format.startswith("synthetic") else f"{info.format}, {how}"
    console.print(f"workload [bold]{escape(info.source)}[/] {escape(f'[{fmt}]')}: {info.header()}",
                  highlight=False, soft_wrap=True)
    for note in info.notes:
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)


def _clock(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class ProgressLines:
    """One line per finished simulation with an ETA, for runs whose output is not a terminal."""

    def __init__(self, total: int, *, quiet: bool = False, out: TextIO | None = None) -> None:
        self.total = total
        self.quiet = quiet
        self.out = out or sys.stderr
        self.count = 0
        self.t0 = time.perf_counter()

    def done(self, label: str, result: RunResult) -> None:
        self.count += 1
        if self.quiet:
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / self.count * (self.total - self.count)
        rate = f" at {result.rate_per_s:g}/s" if result.rate_per_s is not None else ""
        print(f"[{self.count}/{self.total}] {label}{rate}: attainment {result.summary.slo_attainment:.1%} "
              f"({result.wall_s:.1f} s; elapsed {_clock(elapsed)}, ETA {_clock(eta)})", file=self.out, flush=True)
