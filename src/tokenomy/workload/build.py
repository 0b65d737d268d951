"""Build a session's turns over one shared prompt stream and one growing session stream.

Layout of turn k (the invariant every synthetic generator relies on)::

    content_k = ((sys_key, sys_tokens), (session_key, stream_k + new_k + output_k))

where ``stream_k`` is the session stream before turn k (all earlier new tokens and
outputs). So turn k+1's content starts with turn k's prompt *and* output and a prefix
cache sees them reused; ``history_tokens`` of turn k > 0 is ``sys_tokens + stream_k``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenomy.core import Segment, Turn


@dataclass(frozen=True, slots=True)
class Compaction:
    """An agent that compacts its context instead of stopping: a turn whose prompt plus output
    would pass ``at_tokens`` starts a new session stream (``restart()`` gives its key and the
    summary's tokens, which the turn's prompt carries before its new tokens): the history's
    prefix is lost, only the system prompt is still shared."""

    at_tokens: int
    restart: Callable[[], tuple[int, int]]


def grow_turns(
    sys_key: int,
    sys_tokens: int,
    session_key: int,
    new_tokens: Sequence[int],
    output_tokens: Sequence[int],
    think_time_s: Sequence[float],
    max_context_tokens: int | None = None,
    compaction: Compaction | None = None,
) -> tuple[Turn, ...]:
    """Turns for one session; ``new_tokens[k]`` is the user message (k=0) or tool result (k>0).

    With ``compaction``, a turn > 0 over its threshold is made after a compaction. With
    ``max_context_tokens`` the session ends before the first turn whose prompt plus output
    would exceed it (an agent hitting its context window stops); turn 0 is always kept.
    ``think_time_s[0]`` is ignored (turn 0 starts the session).
    """
    if not len(new_tokens) == len(output_tokens) == len(think_time_s) >= 1:
        raise ValueError("new_tokens, output_tokens and think_time_s need the same length >= 1")
    if sys_tokens < 0:
        raise ValueError(f"sys_tokens must be >= 0, got {sys_tokens}")
    turns: list[Turn] = []
    stream = 0
    for k, (new, out, think) in enumerate(zip(new_tokens, output_tokens, think_time_s, strict=True)):
        new = int(new)
        if k > 0 and compaction is not None and sys_tokens + stream + new + int(out) > compaction.at_tokens:
            session_key, summary = compaction.restart()
            stream, new = 0, new + summary
        prompt = sys_tokens + stream + new
        if k > 0 and max_context_tokens is not None and prompt + int(out) > max_context_tokens:
            break
        content: tuple[Segment, ...] = ((session_key, stream + new + int(out)),)
        if sys_tokens:
            content = ((sys_key, sys_tokens), *content)
        turns.append(
            Turn(
                prompt_tokens=prompt,
                output_tokens=int(out),
                history_tokens=0 if k == 0 else sys_tokens + stream,
                think_time_s=0.0 if k == 0 else float(think),
                content=content,
            )
        )
        stream += new + int(out)
    return tuple(turns)
