"""Running counts of AMPD's live decisions, for ``/metrics`` (``AmpdLive.decisions`` keeps only the
latest ones): prefill placements local vs remote, and prefill releases that reordered a queue with
the deferrals they caused, per prefill backend."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any


class AmpdCounts:
    def __init__(self) -> None:
        self.placements: defaultdict[str, int] = defaultdict(int)  # "local" | "remote" -> turns
        self.prefill_reordered: defaultdict[str, int] = defaultdict(int)  # prefill backend -> releases
        self.deferrals: defaultdict[str, int] = defaultdict(int)  # prefill backend -> tasks overtaken

    def add(self, event: Mapping[str, Any]) -> None:
        """Count one decision-trace event (``tokenomy.policy.trace``); other kinds are ignored."""
        kind = event.get("kind")
        if kind == "placement":
            self.placements["local" if event.get("local") else "remote"] += 1
        elif kind == "dispatch":
            overtaken = int(event.get("overtaken") or 0)
            if overtaken > 0:
                backend = str(event.get("prefill_instance") or "")
                self.prefill_reordered[backend] += 1
                self.deferrals[backend] += overtaken
