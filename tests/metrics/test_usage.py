"""TokenUsage sums: every class of token is added, none dropped."""

from __future__ import annotations

import dataclasses

from tokenomy.core import TokenUsage


def test_add_sums_every_field() -> None:
    names = [f.name for f in dataclasses.fields(TokenUsage)]
    a = TokenUsage(**{n: 10 * (i + 1) for i, n in enumerate(names)})
    b = TokenUsage(**{n: i + 1 for i, n in enumerate(names)})
    a.add(b)
    assert dataclasses.asdict(a) == {n: 11 * (i + 1) for i, n in enumerate(names)}
    assert dataclasses.asdict(b) == {n: i + 1 for i, n in enumerate(names)}  # the addend is unchanged
