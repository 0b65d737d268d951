"""Reader for the Azure LLM inference traces 2023 (Azure/AzurePublicDataset, Splitwise).

CSV with header ``TIMESTAMP,ContextTokens,GeneratedTokens``; timestamps are wall-clock
datetimes (``2023-11-16 18:15:46.6805900``, up to 7 fractional digits). The trace has no
sessions and no content: every request becomes a one-turn session whose content is one
fresh stream, so nothing is shared in the prefix cache.
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from tokenomy.core import Session, Turn
from tokenomy.workload.arrivals import jitter_timestamps
from tokenomy.workload.keys import StreamKeys

_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _parse_time(text: str) -> datetime:
    # fromisoformat accepts at most 6 fractional digits on some Python versions; the trace has 7.
    stamp, _, frac = text.strip().partition(".")
    base = datetime.fromisoformat(stamp)
    if frac:
        if not frac.isdigit():
            raise ValueError(f"bad fractional seconds {frac!r}")
        base = base.replace(microsecond=int(frac[:6].ljust(6, "0")))
    return base


def _read_rows(reader: Any, path: str | Path, limit: int | None, stamps: list[datetime],
               lengths: list[tuple[int, int]]) -> None:
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != _HEADER:
        raise ValueError(f"{path}:1: expected header {','.join(_HEADER)}, got {header}")
    for row in reader:
        if not row:
            continue
        where = f"{path}:{reader.line_num}"
        if len(row) != 3:
            raise ValueError(f"{where}: expected 3 columns, got {len(row)}")
        try:
            stamp = _parse_time(row[0])
            n_in, n_out = int(row[1]), int(row[2])
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        if n_in < 1 or n_out < 1:
            raise ValueError(f"{where}: ContextTokens and GeneratedTokens must be >= 1")
        stamps.append(stamp)
        lengths.append((n_in, n_out))
        if limit is not None and len(stamps) >= limit:
            return


def read_azure(
    path: str | Path,
    *,
    limit: int | None = None,
    time_scale: float = 1.0,
    jitter_s: float = 0.0,
    rng: np.random.Generator | None = None,
    keys: StreamKeys | None = None,
    id_prefix: str = "azure",
) -> list[Session]:
    """One-turn sessions ``f"{id_prefix}-{i}"`` (i = data row), sorted by ``start_s``.

    ``start_s = (seconds since the first row + U[0, jitter_s)) * time_scale``. Rows need
    ContextTokens >= 1 and GeneratedTokens >= 1; errors name the file and line.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    stamps: list[datetime] = []
    lengths: list[tuple[int, int]] = []
    with Path(path).open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        try:
            _read_rows(reader, path, limit, stamps, lengths)
        except (UnicodeDecodeError, csv.Error) as exc:
            what = "not UTF-8 text (a binary file?)" if isinstance(exc, UnicodeDecodeError) else f"bad CSV ({exc})"
            raise ValueError(f"{path}:{reader.line_num + 1}: {what}") from None
    if not stamps:
        raise ValueError(f"{path}: no requests")
    t0 = min(stamps)
    raw = np.array([(s - t0).total_seconds() for s in stamps])
    times = jitter_timestamps(raw, jitter_s, rng or np.random.default_rng(0)) * time_scale
    keys = keys or StreamKeys()
    sessions = [
        Session(
            session_id=f"{id_prefix}-{i}",
            start_s=float(times[i]),
            turns=(Turn(prompt_tokens=n_in, output_tokens=n_out, content=((keys.new(), n_in + n_out),)),),
        )
        for i, (n_in, n_out) in enumerate(lengths)
    ]
    sessions.sort(key=lambda s: s.start_s)
    return sessions
