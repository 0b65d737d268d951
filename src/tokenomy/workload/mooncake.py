"""Reader for Mooncake traces (kvcache-ai/Mooncake, FAST'25 release).

One JSON object per line: ``timestamp`` (ms), ``input_length``, ``output_length`` and
``hash_ids``, ids of the prompt's 512-token blocks (``len == ceil(input_length / 512)``).
An id identifies its block *and everything before it*, so two requests sharing an id at
position j share their first j+1 blocks. We keep that sharing: every id becomes its own
content stream of (up to) 512 tokens, and the output becomes a fresh stream, so a prefix
cache keyed on content sees exactly the reuse the trace records.

``sessionize=True`` links requests into multi-turn sessions (rule in :func:`link_turns`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenomy.core import Segment, Session, Turn
from tokenomy.workload.arrivals import jitter_timestamps
from tokenomy.workload.keys import StreamKeys
from tokenomy.workload.textlines import numbered_lines, parse_json_object

MOONCAKE_BLOCK_TOKENS = 512
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True, slots=True)
class MooncakeRequest:
    """One validated trace line; ``timestamp_s`` is the raw timestamp in seconds."""

    timestamp_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_mooncake_requests(path: str | Path, limit: int | None = None) -> list[MooncakeRequest]:
    """Parse and validate the first ``limit`` requests (all if None), in file order.

    Raises ValueError naming the file and line for bad JSON, missing fields, non-integer or
    out-of-range values, or a ``hash_ids`` length that does not match ``input_length``.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    out: list[MooncakeRequest] = []
    for lineno, line in numbered_lines(path):
        where = f"{path}:{lineno}"
        row = parse_json_object(line, where)
        missing = [f for f in _FIELDS if f not in row]
        if missing:
            raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
        ts, n_in, n_out, ids = (row[f] for f in _FIELDS)
        if not isinstance(ts, int | float) or isinstance(ts, bool) or not 0 <= ts < math.inf:
            raise ValueError(f"{where}: timestamp must be a finite number >= 0, got {ts!r}")
        if not (_is_count(n_in) and n_in >= 1 and _is_count(n_out) and n_out >= 1):
            raise ValueError(f"{where}: input_length and output_length must be integers >= 1")
        if not (isinstance(ids, list) and all(_is_count(h) and h >= 0 for h in ids)):
            raise ValueError(f"{where}: hash_ids must be a list of integers >= 0")
        if len(ids) != math.ceil(n_in / MOONCAKE_BLOCK_TOKENS):
            raise ValueError(
                f"{where}: {len(ids)} hash_ids for input_length {n_in} "
                f"(expected ceil({n_in}/{MOONCAKE_BLOCK_TOKENS}))"
            )
        out.append(MooncakeRequest(ts / 1000.0, n_in, n_out, tuple(ids)))
        if limit is not None and len(out) >= limit:
            break
    return out


def link_turns(requests: list[MooncakeRequest], min_shared_blocks: int = 3) -> tuple[list[int], list[int]]:
    """Parent of each request (-1: starts a session) and the blocks it shares with the parent.

    Rule: request r continues an earlier request p when r's blocks start with *all* of p's
    full blocks (a conversation's next prompt contains the previous prompt; p's partial
    last block differs because p's answer was appended to it), p has at least
    ``min_shared_blocks`` full blocks (default 3: block 0 is the system prompt every request
    shares, so this asks for ~1k tokens of own conversation) and p has no continuation yet.
    The longest such p wins; of requests ending in the same block only the latest is a
    candidate. A second request extending the same p (a regenerated answer, a fork) starts
    its own session; its content still shares p's blocks, so cache reuse is kept, only the
    session link is not.
    Linear in the total number of blocks, thanks to prefix-identifying ids.
    """
    if min_shared_blocks < 1:
        raise ValueError(f"min_shared_blocks must be >= 1, got {min_shared_blocks}")
    ends_at: dict[int, int] = {}  # id of a request's last full block -> latest such request
    has_child = [False] * len(requests)
    parent = [-1] * len(requests)
    shared = [0] * len(requests)
    for i, req in enumerate(requests):
        ids = req.hash_ids
        for j in range(len(ids) - 1, min_shared_blocks - 2, -1):
            p = ends_at.get(ids[j], -1)
            if p >= 0 and not has_child[p]:
                parent[i], has_child[p] = p, True
                other = requests[p].hash_ids
                n = j + 1
                while n < min(len(ids), len(other)) and ids[n] == other[n]:
                    n += 1
                shared[i] = n
                break
        full = len(ids) if req.input_tokens % MOONCAKE_BLOCK_TOKENS == 0 else len(ids) - 1
        if full >= 1:
            ends_at[ids[full - 1]] = i
    return parent, shared


def _content(req: MooncakeRequest, base: int, out_key: int) -> tuple[Segment, ...]:
    ids = req.hash_ids
    last = req.input_tokens - MOONCAKE_BLOCK_TOKENS * (len(ids) - 1)
    blocks = [(base + h, MOONCAKE_BLOCK_TOKENS) for h in ids[:-1]]
    return (*blocks, (base + ids[-1], last), (out_key, req.output_tokens))


def read_mooncake(
    path: str | Path,
    *,
    sessionize: bool = False,
    limit: int | None = None,
    time_scale: float = 1.0,
    jitter_s: float = 0.0,
    rng: np.random.Generator | None = None,
    keys: StreamKeys | None = None,
    min_shared_blocks: int = 3,
    id_prefix: str = "mooncake",
) -> list[Session]:
    """Sessions from a Mooncake trace, sorted by ``start_s``.

    Arrival of request i: ``(timestamp_i + U[0, jitter_s)) * time_scale`` seconds (jitter
    spreads the trace's ~3 s quantisation; ``rng`` defaults to ``default_rng(0)``).
    Without ``sessionize`` every request is a one-turn session ``f"{id_prefix}-{i}"``.
    With it, linked requests (:func:`link_turns`) form one session named after its first
    request; turn k's ``think_time_s`` is the arrival gap to turn k-1 (an approximation:
    the trace records arrivals, not answer ends, so a closed-loop replay lands turns later
    by turn k-1's service time) and ``history_tokens`` is the shared prefix in tokens.
    """
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    requests = read_mooncake_requests(path, limit)
    if not requests:
        raise ValueError(f"{path}: no requests")
    keys = keys or StreamKeys()
    base = keys.reserve(max(max(r.hash_ids) for r in requests) + 1)
    raw = np.fromiter((r.timestamp_s for r in requests), dtype=float, count=len(requests))
    times = (jitter_timestamps(raw, jitter_s, rng or np.random.default_rng(0)) * time_scale).tolist()
    turns = [
        Turn(
            prompt_tokens=r.input_tokens, output_tokens=r.output_tokens, content=_content(r, base, keys.new())
        )
        for r in requests
    ]
    if not sessionize:
        sessions = [Session(f"{id_prefix}-{i}", times[i], (t,)) for i, t in enumerate(turns)]
    else:
        sessions = _chain_sessions(requests, turns, times, min_shared_blocks, id_prefix)
    sessions.sort(key=lambda s: s.start_s)
    return sessions


def _chain_sessions(
    requests: list[MooncakeRequest],
    turns: list[Turn],
    times: list[float],
    min_shared_blocks: int,
    id_prefix: str,
) -> list[Session]:
    parent, shared = link_turns(requests, min_shared_blocks)
    child = [-1] * len(requests)
    for i, p in enumerate(parent):
        if p >= 0:
            child[p] = i
    sessions: list[Session] = []
    for root, p in enumerate(parent):
        if p >= 0:
            continue
        chain = [turns[root]]
        prev, i = root, child[root]
        while i >= 0:
            history = min(shared[i] * MOONCAKE_BLOCK_TOKENS, requests[i].input_tokens)
            think = max(0.0, times[i] - times[prev])
            t = turns[i]
            chain.append(Turn(t.prompt_tokens, t.output_tokens, history, think, t.content))
            prev, i = i, child[i]
        sessions.append(Session(f"{id_prefix}-{root}", times[root], tuple(chain)))
    return sessions
