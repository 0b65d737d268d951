"""What the simulator-against-a-live-engine benchmarks share (``sim_vs_emulator.py``, ``sim_vs_vllm.py``,
``closed_loop.py``; not part of the library): the compared figures, the simulated figures as the
mean of jittered draws, the check against a target's tolerances, the printout and the JSON, and the
machine's load average.

A live run is one draw of a noisy process (which request meets a long prefill turns on
milliseconds), and so is one simulation: a P99 of a few hundred requests is one of the slowest few,
and one simulation's can jump with a small change of the step times (docs/vllm.md, "The simulated side as an expectation"). The
simulator's prediction is its expectation over that noise: the mean of ``draws`` simulations of
the same workload with each session's start shifted by up to :data:`JITTER_S`
(:func:`jittered_starts`, :func:`mean_of_draws`). The live figure is measured as before."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np

from tokenomy.core import Session
from tokenomy.metrics import Summary
from tokenomy.metrics.report import write_json

KEYS = {"ttft_p50": "ttft_p50_s", "ttft_p99": "ttft_p99_s", "tpot_p50": "tpot_p50_s", "tpot_p99": "tpot_p99_s",
        "slo_attainment": "slo_attainment"}
"""JSON key -> :class:`Summary` field; each is written as ``[sim, live]``."""

Tolerance = dict[str, tuple[Literal["rel", "abs"], float]]
"""JSON key -> ``("rel", fraction)`` or ``("abs", difference)``."""

JITTER_S = 0.01
"""How far a simulated draw shifts each session's start (uniform, up to 10 ms): about one to three
decode steps of the engines these benchmarks run, so which step a turn joins, and so which requests
meet a long prefill, is drawn anew, while the workload's shape and load are unchanged."""

Figures = dict[str, float | None]
"""JSON key (:data:`KEYS` and ``cached_fraction``) -> one run's value."""


def cached_fraction(s: Summary) -> float | None:
    prompt = s.tokens.get("prompt_tokens", 0)
    return s.tokens.get("cache_hit_tokens", 0) / prompt if prompt else None


def summary_figures(s: Summary) -> Figures:
    """The compared figures of one run (:data:`KEYS` and ``cached_fraction``)."""
    return {**{k: getattr(s, attr) for k, attr in KEYS.items()}, "cached_fraction": cached_fraction(s)}


def jittered_starts(sessions: Sequence[Session], seed: int | Sequence[int],
                    max_shift_s: float = JITTER_S) -> list[Session]:
    """``sessions`` with each start shifted later by up to ``max_shift_s`` (uniform, one draw per
    session in order, from ``numpy.random.default_rng(seed)``); everything else unchanged."""
    rng = np.random.default_rng(seed)
    return [dataclasses.replace(s, start_s=s.start_s + float(rng.uniform(0, max_shift_s))) for s in sessions]


def mean_of_draws(rows: Sequence[Mapping[str, float | None]]) -> dict[str, Any]:
    """``{"mean": {key: mean}, "spread": {key: {"sd", "min", "max", "n"}}}`` over the draws'
    figures, each key over the draws that have a value (``n``; mean None when none has; ``sd``
    the sample standard deviation, 0 for one draw)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    mean: Figures = {}
    spread: dict[str, dict[str, float | int | None]] = {}
    for k in keys:
        v = [float(x) for r in rows if (x := r.get(k)) is not None]
        mean[k] = statistics.fmean(v) if v else None
        spread[k] = {"sd": statistics.stdev(v) if len(v) > 1 else 0.0, "min": min(v, default=None),
                     "max": max(v, default=None), "n": len(v)}
    return {"mean": mean, "spread": spread}


def simulated_expectation(run: Callable[[list[Session]], Summary], sessions: Sequence[Session], draws: int,
                          seed: int, max_shift_s: float = JITTER_S) -> dict[str, Any]:
    """The simulator's figures for ``sessions`` as the mean over ``draws`` runs of ``run`` on
    :func:`jittered_starts` (draw ``k`` seeded ``[seed, k]``): :func:`mean_of_draws` with every
    draw's figures (``by_draw``), ``draws`` and ``max_shift_s``."""
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    rows = [summary_figures(run(jittered_starts(sessions, [seed, k], max_shift_s))) for k in range(draws)]
    return {**mean_of_draws(rows), "draws": draws, "max_shift_s": max_shift_s, "by_draw": rows}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class CpuReading(NamedTuple):
    """The machine's CPU counters at one moment, in seconds: ``t_s`` the uptime clock; ``busy_s``
    every CPU's time not idle (user, nice, system, irq, softirq; not iowait or steal), sampled at
    the kernel's ticks; ``steal_s`` what the hypervisor took; ``own_s`` this process and its
    descendants (the benchmark, ``tokenomy up`` and the engine it started), as the kernel times
    each process (exactly, not by ticks; so ``/proc/stat``'s own nice share is not reported: a niced
    job that runs until the next tick preempts it is counted there out of proportion)."""

    t_s: float
    busy_s: float
    steal_s: float
    own_s: float


def cpu_reading(proc: Path = Path("/proc"), root: int | None = None) -> CpuReading | None:
    """The counters now (``root``: the process whose tree is ours, default this one); None where
    ``proc`` has no ``stat`` (not Linux). A process's own time includes its reaped children's."""
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        cpu = [int(x) / hz for x in (proc / "stat").read_text().splitlines()[0].split()[1:]]
        t = float((proc / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (cpu + [0.0] * 8)[:8]
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
            parent[int(entry.name)] = int(fields[1])
            used[int(entry.name)] = sum(int(x) for x in fields[11:15]) / hz  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue  # the process ended while we read
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    ours: set[int] = set()
    todo = [os.getpid() if root is None else root]
    while todo:  # the root and its descendants
        pid = todo.pop()
        ours.add(pid)
        todo.extend(children.get(pid, ()))
    return CpuReading(t_s=t, busy_s=user + nice + system + irq + softirq, steal_s=steal,
                      own_s=sum(used.get(pid, 0.0) for pid in ours))


def machine_share(a: CpuReading | None, b: CpuReading | None) -> dict[str, float] | None:
    """CPUs in use between readings ``a`` and ``b``, in cores (CPU-seconds per second): all
    (``busy_cores``), by processes outside ours (``foreign_cores``: other users of a shared machine,
    niced or not, which slow vLLM CPU's steps while they run: docs/vllm.md, "Why TPOT P99 comes out low"), and by
    the hypervisor (``steal_cores``); None without both readings."""
    if a is None or b is None or b.t_s <= a.t_s:
        return None
    dt = b.t_s - a.t_s
    busy = b.busy_s - a.busy_s
    return {"seconds": round(dt, 2), "busy_cores": round(busy / dt, 3),
            "foreign_cores": round(max(0.0, busy - (b.own_s - a.own_s)) / dt, 3),
            "steal_cores": round((b.steal_s - a.steal_s) / dt, 3)}


def compare(sim: Summary | Figures, got: Summary, tolerance: Tolerance,
            relative_to: Literal["sim", "live"]) -> dict[str, Any]:
    """``{key: [sim, live]}`` for every :data:`KEYS` and ``cached_fraction``, the ``targets`` as text and
    whether each was ``met`` (None: a side has no value). A relative tolerance is a fraction of the
    ``relative_to`` side's value. ``sim``: one simulation, or figures already drawn from several
    (:func:`simulated_expectation`'s ``mean``)."""
    sim_figures = summary_figures(sim) if isinstance(sim, Summary) else sim
    live = summary_figures(got)
    out: dict[str, Any] = {k: [sim_figures.get(k), live[k]] for k in (*KEYS, "cached_fraction")}
    met: dict[str, bool | None] = {}
    for key, (kind, tol) in tolerance.items():
        a, b = out[key]
        if a is None or b is None:
            met[key] = None
        elif kind == "abs":
            met[key] = abs(a - b) <= tol
        else:
            met[key] = abs(b - a) <= tol * abs(b if relative_to == "live" else a)
    out["targets"] = {k: f"±{tol:g} relative to {relative_to}" if kind == "rel" else f"+-{tol:g}"
                      for k, (kind, tol) in tolerance.items()}
    out["met"] = met
    return out


def report(out: dict[str, Any], path: Path | None) -> None:
    """Print each compared figure with whether it met its target, write ``out`` to ``path`` (when
    given) and print the compared figures as one JSON line."""
    for key in (*KEYS, "cached_fraction"):
        a, b = out[key]
        print(f"{key:16s} sim {a!s:>24s}  live {b!s:>24s}  met {out['met'].get(key, '-')}")
    if path:
        write_json(path, out)
        print(f"wrote {path}")
    print(json.dumps({k: out[k] for k in (*KEYS, "cached_fraction", "met")}))
