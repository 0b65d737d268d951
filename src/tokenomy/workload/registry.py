"""One entry point from a workload spec string to sessions: :func:`load_workload`."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tokenomy.core import Session
from tokenomy.workload.agentic import GAIA, TOOLBENCH, agent_sessions
from tokenomy.workload.arrivals import get_arrival
from tokenomy.workload.azure import read_azure
from tokenomy.workload.chat import chat_sessions
from tokenomy.workload.keys import StreamKeys
from tokenomy.workload.mooncake import read_mooncake
from tokenomy.workload.session_format import read_sessions

SyntheticFn = Callable[[np.ndarray, np.random.Generator, StreamKeys], list[Session]]
"""``(start_times_s, rng, keys) -> sessions``: a synthetic workload."""

SYNTHETIC: dict[str, SyntheticFn] = {
    "chat": lambda t, rng, keys: chat_sessions(t, rng, keys=keys),
    "gaia": lambda t, rng, keys: agent_sessions(GAIA, t, rng, keys=keys),
    "toolbench": lambda t, rng, keys: agent_sessions(TOOLBENCH, t, rng, keys=keys),
}

MOONCAKE_SESSIONS_PREFIX = "mooncake-sessions:"
MOONCAKE_JITTER_S = 3.0
"""Width of the Mooncake trace's arrival buckets; replayed arrivals are spread over it."""

TraceLoader = Callable[[Path, int, bool], tuple[list[Session], bool]]
"""``(path, seed, sessionize) -> (sessions on the trace's own clock, think times are arrival gaps)``."""


def _load_jsonl(path: Path, seed: int, sessionize: bool) -> tuple[list[Session], bool]:
    with path.open(encoding="utf-8") as fh:
        first = next((line for line in fh if line.strip()), "")
    try:
        row = json.loads(first) if first else None
    except json.JSONDecodeError:
        row = None
    if isinstance(row, dict) and "hash_ids" in row:
        rng = np.random.default_rng(seed)
        return read_mooncake(path, sessionize=sessionize, jitter_s=MOONCAKE_JITTER_S, rng=rng), sessionize
    if isinstance(row, dict) and "session_id" in row:
        if sessionize:
            raise ValueError(f"{path}: sessionize applies to Mooncake traces; this file already has sessions")
        return read_sessions(path), False
    raise ValueError(
        f"{path}:1: not a Mooncake trace (no hash_ids) nor a Tokenomy session file (no session_id)"
    )


def _load_csv(path: Path, seed: int, sessionize: bool) -> tuple[list[Session], bool]:
    if sessionize:
        raise ValueError(f"{path}: the Azure trace has no prefix information to sessionize")
    return read_azure(path), False


TRACE_LOADERS: dict[str, TraceLoader] = {".jsonl": _load_jsonl, ".csv": _load_csv}


def _choices() -> str:
    names = ", ".join(sorted(SYNTHETIC))
    exts = ", ".join(f"*{e}" for e in sorted(TRACE_LOADERS))
    return f"{names}, a trace path ({exts}) or {MOONCAKE_SESSIONS_PREFIX}<path.jsonl>"


def _rescale(sessions: list[Session], factor: float, think_too: bool) -> list[Session]:
    out = []
    for s in sessions:
        turns = s.turns
        if think_too:
            turns = tuple(dataclasses.replace(t, think_time_s=t.think_time_s * factor) for t in turns)
        out.append(dataclasses.replace(s, start_s=s.start_s * factor, turns=turns))
    return out


def load_workload(
    spec: str,
    *,
    rate_per_s: float,
    duration_s: float,
    seed: int = 0,
    arrival: str = "poisson",
    arrival_cv: float = 1.0,
    max_sessions: int | None = None,
    sessionize: bool = False,
) -> list[Session]:
    """Sessions for ``spec``, sorted by ``start_s``, with unique ids; deterministic in ``seed``.

    - ``"chat"``, ``"gaia"``, ``"toolbench"``: sessions start by the ``arrival`` process
      (``"poisson"`` or ``"gamma"`` with ``arrival_cv``) at ``rate_per_s`` *sessions* per
      second over ``[0, duration_s)``.
    - a path: ``*.jsonl`` is a Mooncake trace (lines have ``hash_ids``; arrivals jittered over
      the 3 s buckets) or a Tokenomy session file (lines have ``session_id``); ``*.csv`` is an
      Azure LLM trace. ``mooncake-sessions:<path>`` or ``sessionize=True`` links Mooncake
      requests into multi-turn sessions. Trace timing: ``rate_per_s == 0`` keeps the trace's
      clock; ``rate_per_s > 0`` rescales it so sessions start at that mean rate (for
      sessionised Mooncake, think times are arrival gaps and scale with it; recorded think
      times in session files are kept). Then sessions starting at or after ``duration_s``
      are dropped (pass ``math.inf`` for the whole trace).
    - ``max_sessions`` keeps the first N sessions by start time.
    """
    if max_sessions is not None and max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    if spec in SYNTHETIC:
        arrival_rng, shape_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
        starts = get_arrival(arrival)(rate_per_s, duration_s, arrival_cv, arrival_rng)
        if max_sessions is not None:
            starts = starts[:max_sessions]
        return SYNTHETIC[spec](starts, shape_rng, StreamKeys())
    if spec.startswith(MOONCAKE_SESSIONS_PREFIX):
        spec, sessionize = spec[len(MOONCAKE_SESSIONS_PREFIX) :], True
    path = Path(spec)
    loader = TRACE_LOADERS.get(path.suffix.lower())
    if loader is None:
        raise ValueError(f"unknown workload {spec!r}; choices: {_choices()}")
    if not path.is_file():
        raise ValueError(f"workload trace {spec!r} not found")
    if rate_per_s < 0 or math.isnan(rate_per_s):
        raise ValueError(f"rate_per_s must be >= 0 for traces (0 keeps the trace's clock), got {rate_per_s}")
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    sessions, think_is_gap = loader(path, seed, sessionize)
    sessions.sort(key=lambda s: s.start_s)
    if rate_per_s > 0:
        span_s = sessions[-1].start_s - sessions[0].start_s
        if not span_s > 0:
            raise ValueError(f"{path}: all sessions start at the same time; cannot rescale to a rate")
        native_rate = (len(sessions) - 1) / span_s
        sessions = _rescale(sessions, native_rate / rate_per_s, think_is_gap)
    sessions = [s for s in sessions if s.start_s < duration_s]
    return sessions[:max_sessions] if max_sessions is not None else sessions
