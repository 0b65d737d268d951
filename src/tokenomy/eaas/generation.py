"""Greedy generation through a model's own ``generate``, with actions fired between decode steps.

``StepHooks`` is a ``transformers`` streamer: ``generate`` hands it the prompt, then every new token;
when new token n is out it runs the actions registered for step n (kill a server, register one,
drain one) as the first thing of step n + 1, so an event lands between two forward passes of one
generation, deterministically. It also times every step.

Lock-step pairs (``Turnstile``): two generations in two threads take turns step by step, so the
background load of a shared machine, which drifts over tens of milliseconds and more, hits step j of
both alike; a step's time counts only while its thread holds the turn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


class Turnstile:
    """Turns between ``n`` threads, in slot order 0, 1, ..., n - 1, 0, ...; a wait longer than
    ``timeout_s`` (a partner died) raises TimeoutError in the waiting thread."""

    def __init__(self, n: int = 2, timeout_s: float = 60.0) -> None:
        if n < 1:
            raise ValueError(f"a turnstile needs n >= 1 threads, got {n}")
        self.n, self.timeout_s = n, timeout_s
        self._cond = threading.Condition()
        self._turn = 0
        self._done: set[int] = set()

    def wait(self, slot: int) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._turn == slot, self.timeout_s):
                raise TimeoutError(f"slot {slot} waited {self.timeout_s}s for its turn")

    def done(self, slot: int, finished: bool = False) -> None:
        """End ``slot``'s turn (for good if ``finished``) and hand it to the next slot still running."""
        with self._cond:
            if finished:
                self._done.add(slot)
            for i in range(1, self.n + 1):
                nxt = (slot + i) % self.n
                if nxt not in self._done:
                    self._turn = nxt
                    break
            self._cond.notify_all()


class StepHooks:
    """Streamer for ``generate(streamer=...)``: ``actions[n]`` run when new token n (1-based) is out,
    at the start of the step that computes token n + 1. ``step_s[n - 1]`` is the wall time of the step
    that produced token n (token 1: the prefill), actions included.

    With ``actions_timed=False`` the actions run before the step's clock starts (to keep work that
    belongs to neither run, such as reaping a killed process on the same cores, out of both).
    With ``turnstile`` the generation takes part in lock-step turns as ``slot``; ``new_tokens`` must
    then be given so the last step hands its turn on for good."""

    def __init__(self, actions: Mapping[int, Sequence[Callable[[], None]]] | None = None,
                 turnstile: Turnstile | None = None, slot: int = 0, new_tokens: int | None = None,
                 actions_timed: bool = True) -> None:
        self.actions = {k: list(v) for k, v in (actions or {}).items()}
        if any(k < 1 for k in self.actions):
            raise ValueError(f"steps are 1-based (after the first new token), got {sorted(self.actions)}")
        if turnstile is not None and new_tokens is None:
            raise ValueError("lock-step hooks need new_tokens (when to stop taking turns)")
        self.turnstile, self.slot, self.new_tokens = turnstile, slot, new_tokens
        self.actions_timed = actions_timed
        self.step_s: list[float] = []
        self.fired: list[int] = []
        self._puts = 0
        self._t0 = 0.0

    def put(self, value: torch.Tensor) -> None:
        now = time.perf_counter()
        if self._puts:
            self.step_s.append(now - self._t0)
        step, self._puts = self._puts, self._puts + 1
        if self.turnstile is not None:
            last = step == self.new_tokens
            if step:
                self.turnstile.done(self.slot, finished=last)
            if last:
                return
            self.turnstile.wait(self.slot)
            now = time.perf_counter()
        for action in self.actions.get(step, ()):
            action()
        if step in self.actions:
            self.fired.append(step)
        self._t0 = now if self.actions_timed else time.perf_counter()

    def end(self) -> None:
        pass


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
    return Generation(out.sequences[:, prompt.shape[1]:], torch.stack(out.logits), wall, hooks.step_s,
                      hooks.fired)
