"""KV transfer links: FIFO bandwidth queues."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class KVLink:
    """One direction of a link that carries KV caches, one transfer at a time (FIFO).

    A transfer of ``n`` bytes that is handed over at ``now`` starts when the link is free and
    takes ``latency_s + n / bytes_per_s``. Queueing on the link is what turns KV transfer into
    a TTFT problem under load (the whitepaper's common bottleneck).
    """

    bytes_per_s: float
    latency_s: float = 0.0
    busy_until_s: float = 0.0
    bytes_sent: int = 0
    transfers: int = 0

    def __post_init__(self) -> None:
        if self.bytes_per_s <= 0:
            raise ValueError(f"link bandwidth must be positive, got {self.bytes_per_s}")

    def transfer(self, now: float, n_bytes: int) -> float:
        """Queue a transfer; return the time it completes."""
        start = max(now, self.busy_until_s)
        done = start + self.latency_s + n_bytes / self.bytes_per_s
        self.busy_until_s = done
        self.bytes_sent += n_bytes
        self.transfers += 1
        return done

    def queue_delay_s(self, now: float) -> float:
        return max(0.0, self.busy_until_s - now)
