"""Stream micro-batches through a client, optionally injecting events (a server kill), and check
every output against the monolithic reference afterwards.

Throughput windows (see docs/eaas.md): with an event at ``t_event``, *before* is [warmup, t_event),
*during* (the recovery window) is [t_event, t_event + recovery_window_s), *after* is the rest. Tokens
count in the window where their micro-batch completes. ``drop_fraction = max(0, 1 - during/before)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tokenomy.eaas.client import AttentionClient
from tokenomy.eaas.moe import MoEWeights, reference_forward


@dataclass(frozen=True)
class StreamEvent:
    at_s: float
    name: str
    action: Callable[[], None]


@dataclass
class StreamResult:
    duration_s: float
    tokens_sent: int = 0
    tokens_done: int = 0
    lost_tokens: int = 0    # sent but no output (the forward raised)
    wrong_tokens: int = 0   # output differs from the monolithic reference by more than the tolerance
    max_abs_err: float = 0.0
    completions: list[tuple[float, int]] = field(default_factory=list)  # (t_s since start, tokens)
    events: list[tuple[float, str]] = field(default_factory=list)       # (t_s actually fired, name)
    errors: list[str] = field(default_factory=list)

    def throughput_tps(self, start_s: float, end_s: float) -> float:
        """Tokens per second completed in [start_s, end_s)."""
        if end_s <= start_s:
            return 0.0
        return sum(n for t, n in self.completions if start_s <= t < end_s) / (end_s - start_s)


def run_stream(client: AttentionClient, weights: MoEWeights, duration_s: float, batch_tokens: int = 32,
               seed: int = 0, events: tuple[StreamEvent, ...] = (), atol: float = 1e-5,
               on_batch: Callable[[float, int], None] | None = None, max_tokens: int | None = None) -> StreamResult:
    """Send micro-batches of ``batch_tokens`` for ``duration_s`` seconds (or until ``max_tokens`` were
    sent); fire ``events`` on time. ``duration_s`` of the result is the time actually streamed.

    Verification runs after the stream (outside the timed part), token by token.
    """
    if duration_s <= 0 or batch_tokens < 1:
        raise ValueError("duration_s must be > 0 and batch_tokens >= 1")
    gen = torch.Generator().manual_seed(seed)
    pending_events = sorted(events, key=lambda e: e.at_s)
    res = StreamResult(duration_s)
    kept: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    t0 = time.monotonic()
    while (now := time.monotonic() - t0) < duration_s and (max_tokens is None or res.tokens_sent < max_tokens):
        while pending_events and pending_events[0].at_s <= now:
            ev = pending_events.pop(0)
            ev.action()
            res.events.append((time.monotonic() - t0, ev.name))
        x = torch.randn(batch_tokens, weights.config.hidden, generator=gen)
        res.tokens_sent += batch_tokens
        try:
            y: torch.Tensor | None = client.forward(x)
        except Exception as exc:  # a lost batch is a measured outcome here, not a crash
            y = None
            res.lost_tokens += batch_tokens
            res.errors = (res.errors + [f"{type(exc).__name__}: {exc}"])[-5:]
        done_t = time.monotonic() - t0
        if y is not None:
            res.tokens_done += batch_tokens
            res.completions.append((done_t, batch_tokens))
            if on_batch is not None:
                on_batch(done_t, batch_tokens)
        kept.append((x, y))
    res.duration_s = min(duration_s, time.monotonic() - t0)
    for x, y in kept:
        if y is None:
            continue
        err = (y - reference_forward(weights, x)).abs().amax(dim=-1)
        res.wrong_tokens += int((err > atol).sum())
        res.max_abs_err = max(res.max_abs_err, float(err.max()))
    return res
