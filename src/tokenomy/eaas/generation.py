"""Greedy generation through a model's own ``generate``, with actions fired between decode steps.

``StepHooks`` is a ``transformers`` streamer: ``generate`` hands it the prompt, then every new token;
after the n-th new token it runs the actions registered for step n (kill a server, register one,
drain one), so an event lands between two forward passes of one generation, deterministically. It
also timestamps every step, which the failover benchmark splits into before / at / after the event.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


class StepHooks:
    """Streamer for ``generate(streamer=...)``: ``actions[n]`` run right after new token n (1-based),
    before the forward pass that computes token n + 1. ``times_s[i]`` is ``perf_counter`` at put i
    (i = 0: the prompt went in; i >= 1: token i came out)."""

    def __init__(self, actions: Mapping[int, Sequence[Callable[[], None]]] | None = None) -> None:
        self.actions = {k: list(v) for k, v in (actions or {}).items()}
        if any(k < 1 for k in self.actions):
            raise ValueError(f"steps are 1-based (after the first new token), got {sorted(self.actions)}")
        self.times_s: list[float] = []
        self.fired: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        self.times_s.append(time.perf_counter())
        step = len(self.times_s) - 1
        for action in self.actions.get(step, ()):
            action()
        if step in self.actions:
            self.fired.append(step)

    def end(self) -> None:
        pass

    def step_s(self) -> list[float]:
        """Wall time of each new token: ``[t1 - t0, t2 - t1, ...]`` (token 1 includes the prefill)."""
        return [b - a for a, b in zip(self.times_s, self.times_s[1:], strict=False)]


@dataclass
class Generation:
    """``tokens`` [batch, new_tokens] (prompt left out) and ``logits`` [new_tokens, batch, vocab]."""

    tokens: torch.Tensor
    logits: torch.Tensor
    wall_s: float
    step_s: list[float] = field(default_factory=list)
    fired: list[int] = field(default_factory=list)


def generate(model: Any, prompt: torch.Tensor, new_tokens: int, hooks: StepHooks | None = None) -> Generation:
    """Greedy ``model.generate`` of exactly ``new_tokens`` tokens for every row of ``prompt``."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    hooks = hooks or StepHooks()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, streamer=hooks,
                             pad_token_id=model.config.pad_token_id, return_dict_in_generate=True,
                             output_logits=True)
    wall = time.perf_counter() - t0
    return Generation(out.sequences[:, prompt.shape[1]:], torch.stack(out.logits), wall, hooks.step_s(),
                      hooks.fired)
