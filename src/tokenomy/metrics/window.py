"""The window rates, goodput and cost are computed over: the time the system had work.

A run's wall span (first arrival to last finish) is the wrong denominator for closed-loop
agent sessions: a session that thinks for an hour between turns stretches the span by an hour
in which nothing ran, and requests per second, tokens per minute and cost per token come out
absurd. The *busy window* is the total length of the union of every offered request's
``[arrival, finish]`` interval (an unfinished request's interval ends at ``end_s``): idle
stretches with no request in the system do not count. For an open-loop load with requests
always in flight it equals the span. Cost over the busy window is what a fleet that scales to
zero when idle would pay; the span is reported beside it.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenomy.core import RequestRecord


def busy_window_s(records: Iterable[RequestRecord], end_s: float) -> float:
    """Length of the union of ``[arrival_s, finish_s or end_s]`` over ``records``; 0 for none."""
    intervals = sorted(
        (r.arrival_s, max(r.arrival_s, r.finish_s if r.finish_s is not None else end_s)) for r in records
    )
    total = 0.0
    cur_start = cur_end = None
    for start, stop in intervals:
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, stop
        else:
            cur_end = max(cur_end, stop)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def span_s(records: Iterable[RequestRecord], end_s: float) -> float:
    """First arrival to last finish (``end_s`` for an unfinished request); 0 for no records."""
    recs = list(records)
    if not recs:
        return 0.0
    first = min(r.arrival_s for r in recs)
    last = max(r.finish_s if r.finish_s is not None else end_s for r in recs)
    return max(0.0, last - first)
