"""One entry point from a workload spec string to sessions: :func:`load_workload`.

A spec is a synthetic workload's name (``chat``, ``gaia``, ``toolbench``) or a file. A file's
format is chosen explicitly (``format=`` / ``--format``, or a ``FORMAT:`` prefix such as
``sessions:path.jsonl``) or detected: ``*.csv`` is an Azure trace; a JSONL file whose first
line has ``session_id`` is a Tokenomy session file (whatever other fields it has), one with
``timestamp`` and ``hash_ids`` a Mooncake trace. The guess is returned in
:class:`WorkloadInfo` (the CLI prints it) and named in any read error.

Files replay on their own clock, whole, unless a rate or duration is given; what was cut or
rescaled is listed in ``WorkloadInfo.notes``. Synthetic workloads generate at most
``MAX_SYNTHETIC_SESSIONS`` sessions: a rate and duration that would produce more are refused
before anything is allocated.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenomy.core import Session
from tokenomy.workload.agentic import GAIA, TOOLBENCH, agent_sessions
from tokenomy.workload.arrivals import get_arrival
from tokenomy.workload.azure import read_azure
from tokenomy.workload.chat import chat_sessions
from tokenomy.workload.coding_agent import coding_agent_sessions
from tokenomy.workload.keys import StreamKeys
from tokenomy.workload.mooncake import read_mooncake
from tokenomy.workload.session_format import read_sessions
from tokenomy.workload.tenants import TenantMix, assign_tenants
from tokenomy.workload.textlines import numbered_lines, parse_json_object

SyntheticFn = Callable[[np.ndarray, np.random.Generator, StreamKeys], list[Session]]
"""``(start_times_s, rng, keys) -> sessions``: a synthetic workload."""

SYNTHETIC: dict[str, SyntheticFn] = {
    "chat": lambda t, rng, keys: chat_sessions(t, rng, keys=keys),
    "gaia": lambda t, rng, keys: agent_sessions(GAIA, t, rng, keys=keys),
    "toolbench": lambda t, rng, keys: agent_sessions(TOOLBENCH, t, rng, keys=keys),
    "coding-agent": lambda t, rng, keys: coding_agent_sessions(t, rng, keys=keys),
}

MAX_SYNTHETIC_SESSIONS = 100_000
"""Most sessions a synthetic workload generates (rate x duration); about 1 GB of sessions for gaia."""

MOONCAKE_SESSIONS_PREFIX = "mooncake-sessions:"
MOONCAKE_JITTER_S = 3.0
"""Width of the Mooncake trace's arrival buckets; replayed arrivals are spread over it."""

FormatReader = Callable[[Path, int], tuple[list[Session], bool]]
"""``(path, seed) -> (sessions on the file's own clock, think times are arrival gaps)``."""


def _mooncake(sessionize: bool) -> FormatReader:
    def read(path: Path, seed: int) -> tuple[list[Session], bool]:
        rng = np.random.default_rng(seed)
        return read_mooncake(path, sessionize=sessionize, jitter_s=MOONCAKE_JITTER_S, rng=rng), sessionize

    return read


FORMATS: dict[str, FormatReader] = {
    "sessions": lambda path, seed: (read_sessions(path), False),
    "mooncake": _mooncake(False),
    "mooncake-sessions": _mooncake(True),
    "azure": lambda path, seed: (read_azure(path), False),
}
"""File formats by name: Tokenomy sessions, Mooncake (one request per session, or linked into
sessions), Azure LLM inference CSV."""

TRACE_LOADERS: dict[str, str] = {".jsonl": "sessions or mooncake (by the first line)", ".csv": "azure"}
"""What each file extension is read as when no format is given."""


@dataclass(frozen=True)
class WorkloadInfo:
    """What a workload spec turned into: the header a run prints, and what was cut or rescaled."""

    source: str
    format: str
    detected: bool
    sessions: int
    requests: int
    total_sessions: int
    total_requests: int
    span_s: float
    notes: tuple[str, ...] = ()

    def header(self) -> str:
        """E.g. ``12,031 of 12,031 requests (12,031 sessions), 59 min of trace``."""
        kind = "generated" if self.format.startswith("synthetic") else "trace"
        return (f"{self.requests:,} of {self.total_requests:,} requests ({self.sessions:,} of "
                f"{self.total_sessions:,} sessions), {_span(self.span_s)} of {kind} arrivals")

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _choices() -> str:
    return (f"{', '.join(sorted(SYNTHETIC))}, or a file (*.jsonl, *.csv), optionally as FORMAT:path "
            f"with FORMAT one of {', '.join(FORMATS)}")


def split_format(spec: str, format: str | None) -> tuple[str, str | None]:
    """``(path, format)`` from ``FORMAT:path`` or an explicit ``format``; both at once must agree."""
    head, sep, tail = spec.partition(":")
    if sep and head in FORMATS:
        if format is not None and format != head:
            raise ValueError(f"workload {spec!r} says format {head!r} but --format is {format!r}")
        return tail, head
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown workload format {format!r}; known: {', '.join(FORMATS)}")
    return spec, format


def detect_format(path: Path) -> str:
    """The format of ``path`` by its extension and first line (see the module docstring)."""
    if path.suffix.lower() == ".csv":
        return "azure"
    if path.suffix.lower() != ".jsonl":
        raise ValueError(f"{path}: cannot tell the format from the extension; pass --format "
                         f"({', '.join(FORMATS)}) or a FORMAT: prefix")
    for lineno, line in numbered_lines(path):
        row = parse_json_object(line, f"{path}:{lineno} (detecting the format)")
        if "session_id" in row:
            return "sessions"
        if "hash_ids" in row and "timestamp" in row:
            return "mooncake"
        raise ValueError(f"{path}:{lineno}: neither a session file (no session_id) nor a Mooncake trace "
                         f"(no timestamp + hash_ids); pass --format ({', '.join(FORMATS)})")
    raise ValueError(f"{path}: empty file")


def _rescale(sessions: list[Session], factor: float, think_too: bool) -> list[Session]:
    out = []
    for s in sessions:
        turns = s.turns
        if think_too:
            turns = tuple(dataclasses.replace(t, think_time_s=t.think_time_s * factor) for t in turns)
        out.append(dataclasses.replace(s, start_s=s.start_s * factor, turns=turns))
    return out


def _count(sessions: list[Session]) -> int:
    return sum(len(s.turns) for s in sessions)


def check_synthetic_size(spec: str, rate_per_s: float | None, duration_s: float | None) -> tuple[float, float]:
    """``(rate, duration)`` a synthetic workload would use (defaults 1/s, 120 s); ValueError if not
    finite and positive, or if they would generate more than ``MAX_SYNTHETIC_SESSIONS`` sessions."""
    rate = 1.0 if rate_per_s is None else rate_per_s
    duration = 120.0 if duration_s is None else duration_s
    if not (0 < rate < math.inf) or not (0 < duration < math.inf):
        raise ValueError(f"synthetic workload {spec!r} needs a finite rate > 0 and duration > 0, "
                         f"got --rate {rate:g} --duration {duration:g}")
    expected = rate * duration
    if expected > MAX_SYNTHETIC_SESSIONS:
        raise ValueError(f"--rate {rate:g} x --duration {duration:g} would generate ~{expected:.3g} sessions; "
                         f"the cap is {MAX_SYNTHETIC_SESSIONS:,}: lower --rate or --duration")
    return rate, duration


def _synthetic(spec: str, rate_per_s: float | None, duration_s: float | None, seed: int, arrival: str,
               arrival_cv: float, max_sessions: int | None) -> tuple[list[Session], WorkloadInfo]:
    rate, duration = check_synthetic_size(spec, rate_per_s, duration_s)
    arrival_rng, shape_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    starts = get_arrival(arrival)(rate, duration, arrival_cv, arrival_rng)
    total = len(starts)
    if max_sessions is not None:
        starts = starts[:max_sessions]
    sessions = SYNTHETIC[spec](starts, shape_rng, StreamKeys())
    n = _count(sessions)
    notes = (f"--max-sessions kept {len(sessions):,} of {total:,} sessions",) if len(sessions) < total else ()
    # Requests of sessions --max-sessions dropped are unknown (never generated): totals count kept ones.
    info = WorkloadInfo(spec, f"synthetic:{arrival}", False, len(sessions), n, total, n, duration, notes)
    return sessions, info


def load_workload_info(
    spec: str,
    *,
    format: str | None = None,
    rate_per_s: float | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    arrival: str = "poisson",
    arrival_cv: float = 1.0,
    max_sessions: int | None = None,
    sessionize: bool = False,
    tenants: str | TenantMix | None = None,
) -> tuple[list[Session], WorkloadInfo]:
    """:func:`load_workload`, plus a :class:`WorkloadInfo` saying what ran and what was cut."""
    sessions, info = _load_workload_info(spec, format=format, rate_per_s=rate_per_s, duration_s=duration_s,
                                         seed=seed, arrival=arrival, arrival_cv=arrival_cv,
                                         max_sessions=max_sessions, sessionize=sessionize)
    if tenants is None:
        return sessions, info
    mix = TenantMix.parse(tenants) if isinstance(tenants, str) else tenants
    sessions = assign_tenants(sessions, mix, seed)
    note = f"tenants drawn from {mix.to_text()} (sessions that named a tenant kept it)"
    return sessions, dataclasses.replace(info, notes=(*info.notes, note))


def _load_workload_info(
    spec: str,
    *,
    format: str | None,
    rate_per_s: float | None,
    duration_s: float | None,
    seed: int,
    arrival: str,
    arrival_cv: float,
    max_sessions: int | None,
    sessionize: bool,
) -> tuple[list[Session], WorkloadInfo]:
    if max_sessions is not None and max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    if spec in SYNTHETIC:
        if format is not None or sessionize:
            raise ValueError(f"workload {spec!r} is synthetic: --format and sessionize apply to files")
        return _synthetic(spec, rate_per_s, duration_s, seed, arrival, arrival_cv, max_sessions)
    if spec.startswith(MOONCAKE_SESSIONS_PREFIX):
        sessionize = True
    path_text, fmt = split_format(spec, format)
    path = Path(path_text)
    if not path.is_file():
        if fmt is None and path.suffix.lower() not in TRACE_LOADERS:
            raise ValueError(f"unknown workload {spec!r}; choices: {_choices()}")
        raise ValueError(f"workload file {path_text!r} not found")
    if rate_per_s is not None and not (0 <= rate_per_s < math.inf):
        raise ValueError(f"--rate must be a finite number >= 0 for a trace (0 keeps its clock), got {rate_per_s}")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"--duration must be > 0, got {duration_s}")
    detected = fmt is None
    fmt = fmt or detect_format(path)
    if sessionize:
        if fmt not in ("mooncake", "mooncake-sessions"):
            raise ValueError(f"{path}: sessionize applies to Mooncake traces; this file is read as {fmt}")
        fmt = "mooncake-sessions"
    try:
        sessions, think_is_gap = FORMATS[fmt](path, seed)
    except ValueError as exc:
        how = "detected" if detected else "chosen"
        raise ValueError(f"{exc} [read as {fmt}, {how}; --format picks another]") from None
    if not sessions:
        raise ValueError(f"{path}: no sessions [read as {fmt}]")
    sessions.sort(key=lambda s: s.start_s)
    total_sessions, total_requests = len(sessions), _count(sessions)
    notes: list[str] = []
    if rate_per_s:
        span_s = sessions[-1].start_s - sessions[0].start_s
        if not span_s > 0:
            raise ValueError(f"{path}: all sessions start at the same time; cannot rescale to --rate {rate_per_s:g}")
        native_rate = (len(sessions) - 1) / span_s
        factor = native_rate / rate_per_s
        sessions = _rescale(sessions, factor, think_is_gap)
        notes.append(f"rescaled from {native_rate:.3g} to {rate_per_s:g} sessions/s (time x {factor:.3g})")
    if duration_s is not None:
        kept = [s for s in sessions if s.start_s < duration_s]
        if len(kept) < len(sessions):
            notes.append(f"--duration {duration_s:g} s cut {len(sessions) - len(kept):,} of {len(sessions):,} sessions")
        sessions = kept
    if max_sessions is not None and len(sessions) > max_sessions:
        notes.append(f"--max-sessions kept {max_sessions:,} of {len(sessions):,} sessions")
        sessions = sessions[:max_sessions]
    span = sessions[-1].start_s - sessions[0].start_s if sessions else 0.0
    info = WorkloadInfo(str(path), fmt, detected, len(sessions), _count(sessions), total_sessions,
                        total_requests, span, tuple(notes))
    return sessions, info


def load_workload(
    spec: str,
    *,
    format: str | None = None,
    rate_per_s: float | None = None,
    duration_s: float | None = None,
    seed: int = 0,
    arrival: str = "poisson",
    arrival_cv: float = 1.0,
    max_sessions: int | None = None,
    sessionize: bool = False,
    tenants: str | TenantMix | None = None,
) -> list[Session]:
    """Sessions for ``spec``, sorted by ``start_s``, with unique ids; deterministic in ``seed``.

    - ``"chat"``, ``"gaia"``, ``"toolbench"``: sessions start by the ``arrival`` process
      (``"poisson"`` or ``"gamma"`` with ``arrival_cv``) at ``rate_per_s`` *sessions* per
      second (default 1) over ``[0, duration_s)`` (default 120 s); more than
      ``MAX_SYNTHETIC_SESSIONS`` expected sessions are refused.
    - a file (format rules in the module docstring): replayed on its own clock, whole, when
      ``rate_per_s`` is None or 0 and ``duration_s`` None. ``rate_per_s > 0`` rescales the
      clock so sessions start at that mean rate (for sessionised Mooncake, think times are
      arrival gaps and scale with it; recorded think times in session files are kept); then
      sessions starting at or after ``duration_s`` are dropped. ``mooncake-sessions:<path>``
      or ``sessionize=True`` links Mooncake requests into multi-turn sessions.
    - ``max_sessions`` keeps the first N sessions by start time.
    - ``tenants`` (a :class:`~tokenomy.workload.tenants.TenantMix` or its text, e.g.
      ``"gold:0.2,silver:0.3,free:0.5"``) gives every session without a tenant one drawn from
      the mix, deterministically in ``seed`` (synthetic workloads and traces alike).

    Raises ValueError (one line naming the file and line, and the format it was read as).
    """
    return load_workload_info(
        spec, format=format, rate_per_s=rate_per_s, duration_s=duration_s, seed=seed, arrival=arrival,
        arrival_cv=arrival_cv, max_sessions=max_sessions, sessionize=sessionize, tenants=tenants,
    )[0]
