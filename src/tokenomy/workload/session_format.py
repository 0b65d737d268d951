"""Tokenomy's session trace format: JSONL, one line per request (turn).

Fields (docs/workloads.md has the full description):

- ``session_id`` (str), ``turn`` (int, 0, 1, 2, ... in file order within a session;
  sessions may interleave), ``input_tokens`` and ``output_tokens`` (int >= 1);
- turn 0: ``arrival_s`` (session start, >= 0); later turns: ``think_time_s`` (>= 0, the
  delay after the previous turn's answer);
- optional ``history_tokens`` (default 0, at most ``input_tokens``);
- optional token identity, at most one of: ``content``, a list of ``[stream_key, n_tokens]``
  pairs (what :func:`write_sessions` writes), or ``prefix_hashes`` + ``hash_block_tokens``
  (Mooncake-style block ids; each id becomes a stream of one block, the last one the
  remainder, and the output a fresh stream keyed above every key in the file);
- optional ``tenant`` (str) and ``priority`` (int): session-wide, given on any line of the
  session; lines that give them must agree;
- optional ``tier`` (str), ``budget_tokens`` (int >= 1) and ``rate_limit_tokens_per_s``
  (number > 0): tenant-wide, session-wide like ``tenant``; every session of a tenant that
  gives one must give the same value.

``read_sessions(write_sessions(sessions))`` returns equal sessions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenomy.core import Segment, Session, Turn
from tokenomy.workload.textlines import numbered_lines, parse_json_object

_REQUIRED = ("session_id", "turn", "input_tokens", "output_tokens")


def write_sessions(path: str | Path, sessions: Iterable[Session]) -> int:
    """Write ``sessions`` (turns of a session on consecutive lines); returns lines written."""
    lines: list[str] = []
    for s in sessions:
        for k, t in enumerate(s.turns):
            row: dict[str, Any] = {"session_id": s.session_id, "turn": k}
            if k == 0:
                row["arrival_s"] = s.start_s
            if k > 0 or t.think_time_s:
                row["think_time_s"] = t.think_time_s
            row["input_tokens"] = t.prompt_tokens
            row["output_tokens"] = t.output_tokens
            if t.history_tokens:
                row["history_tokens"] = t.history_tokens
            if t.content:
                row["content"] = [[key, n] for key, n in t.content]
            if k == 0 and s.tenant != "default":
                row["tenant"] = s.tenant
            if k == 0 and s.priority != 0:
                row["priority"] = s.priority
            if k == 0:
                row.update(_tenant_fields(s))
            lines.append(json.dumps(row, separators=(",", ":")))
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


_TENANT_FIELDS = ("tier", "budget_tokens", "rate_limit_tokens_per_s")


def _tenant_fields(s: Session) -> dict[str, Any]:
    """The tenant-wide fields a session carries (none when unset)."""
    values = {"tier": s.tier or None, "budget_tokens": s.budget_tokens,
              "rate_limit_tokens_per_s": s.rate_limit_tokens_per_s}
    return {k: v for k, v in values.items() if v is not None}


def _tenant_value(row: dict[str, Any], name: str, where: str) -> Any:
    value = row[name]
    if name == "tier":
        ok = isinstance(value, str)
    elif name == "budget_tokens":
        ok = type(value) is int and value >= 1
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
    if not ok:
        what = {"tier": "a string", "budget_tokens": "an integer >= 1",
                "rate_limit_tokens_per_s": "a finite number > 0"}[name]
        raise ValueError(f"{where}: {name} must be {what}, got {value!r}")
    return float(value) if name == "rate_limit_tokens_per_s" else value


def _int(row: dict[str, Any], name: str, where: str, minimum: int) -> int:
    value = row[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{where}: {name} must be an integer >= {minimum}, got {value!r}")
    return value


def _seconds(row: dict[str, Any], name: str, where: str) -> float:
    value = row[name]
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise ValueError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _parse_line(line: str, where: str) -> dict[str, Any]:
    row = parse_json_object(line, where)
    missing = [f for f in _REQUIRED if f not in row]
    if row.get("turn") == 0 and "arrival_s" not in row:
        missing.append("arrival_s (turn 0)")
    elif row.get("turn", 0) != 0 and "think_time_s" not in row:
        missing.append("think_time_s (turn > 0)")
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    if not isinstance(row["session_id"], str) or not row["session_id"]:
        raise ValueError(f"{where}: session_id must be a non-empty string")
    if "content" in row and "prefix_hashes" in row:
        raise ValueError(f"{where}: give either content or prefix_hashes, not both")
    if ("prefix_hashes" in row) != ("hash_block_tokens" in row):
        raise ValueError(f"{where}: prefix_hashes and hash_block_tokens go together")
    return row


def _raw_keys(row: dict[str, Any], where: str) -> list[int]:
    """Stream keys a line names (validated), so fresh output keys can be placed above them."""
    if "content" in row:
        segs = row["content"]
        ok = isinstance(segs, list) and all(
            isinstance(s, list) and len(s) == 2 and all(type(v) is int and v >= 0 for v in s) for s in segs
        )
        if not ok:
            raise ValueError(
                f"{where}: content must be a list of [stream_key, n_tokens] non-negative integers"
            )
        return [s[0] for s in segs]
    if "prefix_hashes" in row:
        ids = row["prefix_hashes"]
        if not (isinstance(ids, list) and all(type(h) is int and h >= 0 for h in ids)):
            raise ValueError(f"{where}: prefix_hashes must be a list of integers >= 0")
        return list(ids)
    return []


def _turn(row: dict[str, Any], where: str, out_key: int) -> Turn:
    n_in = _int(row, "input_tokens", where, 1)
    n_out = _int(row, "output_tokens", where, 1)
    history = _int(row, "history_tokens", where, 0) if "history_tokens" in row else 0
    if history > n_in:
        raise ValueError(f"{where}: history_tokens {history} exceeds input_tokens {n_in}")
    think = _seconds(row, "think_time_s", where) if "think_time_s" in row else 0.0
    content: tuple[Segment, ...] = ()
    if "content" in row:
        content = tuple((int(k), int(n)) for k, n in row["content"])
        if sum(n for _, n in content) < n_in:
            raise ValueError(f"{where}: content covers fewer tokens than input_tokens {n_in}")
    elif "prefix_hashes" in row:
        block = _int(row, "hash_block_tokens", where, 1)
        ids = row["prefix_hashes"]
        if len(ids) != math.ceil(n_in / block):
            raise ValueError(f"{where}: {len(ids)} prefix_hashes for input_tokens {n_in} (block {block})")
        last = n_in - block * (len(ids) - 1)
        content = (*((h, block) for h in ids[:-1]), (ids[-1], last), (out_key, n_out))
    return Turn(
        prompt_tokens=n_in, output_tokens=n_out, history_tokens=history, think_time_s=think, content=content
    )


def read_sessions(path: str | Path) -> list[Session]:
    """Sessions in order of their first line; ValueError with ``path:line`` on bad input."""
    rows: list[tuple[str, dict[str, Any]]] = []
    top_key = -1
    for lineno, line in numbered_lines(path):
        where = f"{path}:{lineno}"
        row = _parse_line(line, where)
        top_key = max([top_key, *_raw_keys(row, where)])
        rows.append((where, row))
    next_key = top_key + 1
    turns: dict[str, list[Turn]] = {}
    meta: dict[str, dict[str, Any]] = {}
    for where, row in rows:
        sid = row["session_id"]
        k = _int(row, "turn", where, 0)
        expected = len(turns.get(sid, []))
        if k != expected:
            raise ValueError(f"{where}: session {sid!r} turn {k} out of order (expected turn {expected})")
        if k == 0:
            meta[sid] = {"start_s": _seconds(row, "arrival_s", where), "tenant": "default", "priority": 0}
            turns[sid] = []
        for name, kind in (("tenant", str), ("priority", int)):
            if name in row:
                if type(row[name]) is not kind:
                    raise ValueError(f"{where}: {name} must be {kind.__name__}")
                if k > 0 and meta[sid].get(f"{name}_set") and row[name] != meta[sid][name]:
                    raise ValueError(f"{where}: {name} differs from earlier lines of session {sid!r}")
                meta[sid][name], meta[sid][f"{name}_set"] = row[name], True
        for name in _TENANT_FIELDS:
            if name in row:
                value = _tenant_value(row, name, where)
                if name in meta[sid] and meta[sid][name] != value:
                    raise ValueError(f"{where}: {name} differs from earlier lines of session {sid!r}")
                meta[sid][name] = value
        uses_hashes = "prefix_hashes" in row
        try:
            turns[sid].append(_turn(row, where, next_key))
        except ValueError as exc:
            msg = str(exc)
            raise ValueError(msg if msg.startswith(where) else f"{where}: {msg}") from None
        next_key += uses_hashes
    sessions = [
        Session(
            sid, meta[sid]["start_s"], tuple(ts), tenant=meta[sid]["tenant"], priority=meta[sid]["priority"],
            tier=meta[sid].get("tier", ""), budget_tokens=meta[sid].get("budget_tokens"),
            rate_limit_tokens_per_s=meta[sid].get("rate_limit_tokens_per_s"),
        )
        for sid, ts in turns.items()
    ]
    _check_tenants_agree(sessions, path)
    return sessions


def _check_tenants_agree(sessions: list[Session], path: str | Path) -> None:
    """Every session of a tenant that gives a tenant-wide field gives the same value."""
    seen: dict[tuple[str, str], tuple[Any, str]] = {}
    for s in sessions:
        for name, value in _tenant_fields(s).items():
            first = seen.setdefault((s.tenant, name), (value, s.session_id))
            if first[0] != value:
                raise ValueError(f"{path}: tenant {s.tenant!r}: {name} is {first[0]!r} in session "
                                 f"{first[1]!r} but {value!r} in session {s.session_id!r}")
