"""The prefix cache of the fake upstreams: how much of a prompt an earlier sequence already holds."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def shared_prefix(seen: Iterable[Sequence[str]], prompt: Sequence[str]) -> int:
    """The longest run of leading tokens ``prompt`` shares with one of the ``seen`` sequences."""
    best = 0
    for prev in seen:
        n = 0
        for a, b in zip(prev, prompt, strict=False):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return best
