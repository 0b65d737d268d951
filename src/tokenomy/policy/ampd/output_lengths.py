"""Output lengths seen so far, for AMPD's forward-looking TPOT bank (docs/ampd.md).

The forward-looking bank (:mod:`tokenomy.engine.tpot_bank`) needs how many more tokens a stream
will surely emit. A request's own output length is unknown while it streams, so the bank uses a
low quantile of the output lengths of turns that already finished on this deployment, learned
online: ``quantile`` (0.1, a labelled default: nine streams in ten emit at least that many) over
the last ``window`` finished turns (1000, a labelled default: recent traffic), and nothing (0)
before ``min_samples`` (50, a labelled default) have finished.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OutputLengthConfig:
    quantile: float = 0.1
    window: int = 1000
    min_samples: int = 50

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantile < 1.0:
            raise ValueError(f"quantile must be in [0, 1), got {self.quantile}")
        if not 1 <= self.min_samples <= self.window:
            raise ValueError(f"need 1 <= min_samples <= window, got {self.min_samples}, {self.window}")


class OutputLengths:
    """A sliding window of finished turns' output lengths and its low quantile."""

    def __init__(self, config: OutputLengthConfig | None = None) -> None:
        self.config = config or OutputLengthConfig()
        self._recent: deque[int] = deque()
        self._sorted: list[int] = []

    def __len__(self) -> int:
        return len(self._recent)

    def observe(self, output_tokens: int) -> None:
        """A turn finished with ``output_tokens`` tokens (the oldest leaves a full window)."""
        if output_tokens < 0:
            raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
        self._recent.append(output_tokens)
        insort(self._sorted, output_tokens)
        if len(self._recent) > self.config.window:
            old = self._recent.popleft()
            del self._sorted[bisect_left(self._sorted, old)]

    def expected_tokens(self) -> int:
        """The configured quantile of the window (0 until ``min_samples`` turns finished)."""
        if len(self._sorted) < self.config.min_samples:
            return 0
        return self._sorted[int(self.config.quantile * (len(self._sorted) - 1))]
