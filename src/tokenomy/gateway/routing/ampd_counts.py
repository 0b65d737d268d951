"""Running counts of AMPD's live decisions (``AmpdLive.decisions`` keeps only the latest ones):
prefill placements local vs remote, and prefill releases that reordered a queue with the
deferrals they caused, per prefill backend, for ``/metrics``; and the same per time bucket over
the last ``BUCKETS * BUCKET_S`` seconds, for the console's charts (constant memory)."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Any

BUCKET_S = 30.0  # console chart resolution
BUCKETS = 20  # ten minutes of history
SERIES = ("local prefill", "remote prefill", "reorders", "deferrals")


class AmpdCounts:
    def __init__(self) -> None:
        self.placements: defaultdict[str, int] = defaultdict(int)  # "local" | "remote" -> turns
        self.prefill_reordered: defaultdict[str, int] = defaultdict(int)  # prefill backend -> releases
        self.deferrals: defaultdict[str, int] = defaultdict(int)  # prefill backend -> tasks overtaken
        self._recent: deque[tuple[int, dict[str, int]]] = deque(maxlen=BUCKETS)  # (bucket index, counts)

    def add(self, event: Mapping[str, Any]) -> None:
        """Count one decision-trace event (``tokenomy.policy.trace``); other kinds are ignored."""
        kind = event.get("kind")
        if kind == "placement":
            where = "local" if event.get("local") else "remote"
            self.placements[where] += 1
            self._bump(event, {f"{where} prefill": 1})
        elif kind == "dispatch":
            overtaken = int(event.get("overtaken") or 0)
            if overtaken > 0:
                backend = str(event.get("prefill_instance") or "")
                self.prefill_reordered[backend] += 1
                self.deferrals[backend] += overtaken
                self._bump(event, {"reorders": 1, "deferrals": overtaken})

    def _bump(self, event: Mapping[str, Any], counts: Mapping[str, int]) -> None:
        index = int(float(event.get("t_s") or 0.0) // BUCKET_S)
        if not self._recent or self._recent[-1][0] < index:
            self._recent.append((index, dict.fromkeys(SERIES, 0)))
        bucket = self._recent[-1][1] if self._recent[-1][0] == index else None
        if bucket is None:  # an event older than the newest bucket (clock order is not guaranteed)
            bucket = next((b for i, b in self._recent if i == index), None)
            if bucket is None:
                return
        for name, n in counts.items():
            bucket[name] += n

    def series(self, now_s: float) -> tuple[list[float], dict[str, list[int]]]:
        """(bucket start times, seconds before ``now_s``; counts per series), oldest bucket first,
        covering the last ``BUCKETS`` buckets up to the one holding ``now_s``."""
        last = int(now_s // BUCKET_S)
        first = last - BUCKETS + 1
        out = {name: [0] * BUCKETS for name in SERIES}
        for index, counts in self._recent:
            if first <= index <= last:
                for name, n in counts.items():
                    out[name][index - first] += n
        return [index * BUCKET_S - now_s for index in range(first, last + 1)], out
