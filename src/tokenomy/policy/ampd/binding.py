"""AMPD session binding: a session's turns return to the decode instance holding its KV.

Rules (docs/ampd.md, "Session binding"):

* A request needs ``need = ceil((prompt_tokens - cached + max_output_tokens) / block_size)``
  free blocks on an instance, where ``cached`` is what that instance's prefix cache already
  holds of the prompt. KV of the session that the instance keeps (pinned or cached) is
  therefore not counted twice.
* **First binding** (or a request without a session): among instances that keep
  ``kv_headroom_fraction`` of their blocks free after ``need``, the fewest requests
  (running + waiting), then the most free blocks left, then the smallest id. If none has
  that headroom, the instance with the most free blocks left.
* **Later turns** stay on the bound instance while it has room:
  ``free_blocks - need >= rebind_headroom_fraction * total_blocks`` (default 0: the grown
  context still fits). The lower threshold than for first binding is hysteresis, so a
  session does not flap between instances near the limit.
* **Rebind** when the bound instance is gone or has no room: to the instance the first-binding
  rule picks among the others (its ``need`` counts the whole context, since the history
  must be transferred or recomputed there). If no other instance has room either, the
  session stays where its history is (moving would not help) and the decision says so.
* **History follows a rebind** (``move_history_on_rebind``, default on): when a session moves
  away from an instance that still exists, the decision asks for its history KV (what the old
  instance holds on GPU or in its host tier) to be sent to the new instance over the KV network
  (as Mooncake's store or Dynamo's KVBM serve a remote node's KV), so the next turns reload it
  instead of recomputing it. Sending 40k tokens of Llama-3.1-8B KV at 50 GB/s takes ~0.1 s,
  recomputing them ~1.5 s of a whole GPU.
* **Forgetting**: a binding not used for ``idle_ttl_s`` is dropped (its session ended, or its KV
  is long gone), and at most ``max_sessions`` are kept (the least recently used goes first), so
  a long-running gateway's binder does not grow without end. A forgotten session that comes
  back is bound afresh, like a new one.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenomy.core import Request
from tokenomy.policy.trace import TraceSink, emit, fields_dict
from tokenomy.policy.view import InstanceView


@dataclass(frozen=True, slots=True)
class BindingConfig:
    """Thresholds of session binding, as fractions of an instance's KV blocks.

    ``kv_headroom_fraction``: blocks a newly bound instance must keep free after admitting
    the session (our choice, 0.1, leaves room for the session to grow over its turns).
    ``rebind_headroom_fraction``: free blocks below which a bound session moves (0.0: only
    when its grown context no longer fits).
    ``move_history_on_rebind``: a rebound session's history KV follows it (module docstring;
    our default True; False: the new instance recomputes it, the behaviour before 2026-12-01).
    ``idle_ttl_s`` / ``max_sessions``: labelled defaults bounding what the binder remembers (an
    hour idle is far past any tool call's latency and any engine's KV retention; 100k sessions
    take ~20 MB).
    """

    kv_headroom_fraction: float = 0.1
    rebind_headroom_fraction: float = 0.0
    move_history_on_rebind: bool = True
    idle_ttl_s: float = 3600.0
    max_sessions: int = 100_000

    def __post_init__(self) -> None:
        for name in ("kv_headroom_fraction", "rebind_headroom_fraction"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if not self.idle_ttl_s > 0:
            raise ValueError(f"idle_ttl_s must be > 0, got {self.idle_ttl_s}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")


@dataclass(frozen=True, slots=True)
class BindingDecision:
    """Where a request's decode runs.

    ``instance_id`` is the decode instance (the ``to`` of a rebind); ``rebound`` is True when
    the session moved away from ``from_instance``; ``new_binding`` is True for a session's
    first binding (False for stateless requests, which are never remembered).
    ``move_history`` True: send the session's history KV from ``from_instance`` (GPU or host
    tier) to ``instance_id`` (only on a rebind away from an instance that still exists).
    """

    session_id: str
    instance_id: str
    rebound: bool = False
    from_instance: str | None = None
    new_binding: bool = False
    reason: str = ""
    move_history: bool = False

    @property
    def to_instance(self) -> str:
        return self.instance_id

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, for the decision trace."""
        return fields_dict(self)


def history_follows(config: BindingConfig | None, home: str | None, target: str) -> bool:
    """Whether a session's history KV held on ``home`` should be sent to ``target``, where its
    next turn runs: only when they differ and ``move_history_on_rebind`` is on (also used by the
    host-tier baselines, whose router rather than a binder moves sessions)."""
    return config is not None and config.move_history_on_rebind and home is not None and home != target


def blocks_needed(request: Request, view: InstanceView) -> int:
    """Free blocks ``request`` would take on ``view``: its uncached prompt plus its output."""
    cached = min(view.cached_prefix_tokens(request.content, request.prompt_tokens), request.prompt_tokens)
    tokens = request.prompt_tokens - cached + request.max_output_tokens
    return math.ceil(tokens / max(1, view.block_size_tokens))


class SessionBinder:
    """Binds sessions to decode instances; remembers a binding until :meth:`unbind`, until it has
    not been used for ``idle_ttl_s``, or until ``max_sessions`` newer ones push it out."""

    def __init__(self, config: BindingConfig, *, trace: TraceSink | None = None) -> None:
        self.config = config
        self.trace = trace
        self._bound: OrderedDict[str, str] = OrderedDict()  # least recently used first
        self._seen_s: dict[str, float] = {}  # session -> when its binding was last used

    def __len__(self) -> int:
        return len(self._bound)

    def bound_instance(self, session_id: str) -> str | None:
        return self._bound.get(session_id)

    def adopt(self, session_id: str, instance_id: str) -> None:
        """Take a binding made elsewhere (another gateway replica, through a shared store); it
        counts as used now (its idle clock starts at the next :meth:`bind`)."""
        self._bound[session_id] = instance_id
        self._bound.move_to_end(session_id)

    def unbind(self, session_id: str) -> None:
        """Forget a session (it ended); unknown ids are ignored."""
        self._bound.pop(session_id, None)
        self._seen_s.pop(session_id, None)

    def _forget_idle(self, now: float) -> None:
        """Drop bindings idle for ``idle_ttl_s`` and the oldest past ``max_sessions`` (the order
        of ``_bound`` is last use, so both come off its front)."""
        ttl, cap = self.config.idle_ttl_s, self.config.max_sessions
        while self._bound:
            sid = next(iter(self._bound))
            if len(self._bound) <= cap and self._seen_s.get(sid, now) + ttl > now:
                return
            self.unbind(sid)

    def _touch(self, sid: str, instance_id: str, now: float) -> None:
        self._bound[sid] = instance_id
        self._bound.move_to_end(sid)
        self._seen_s[sid] = now

    def bind(self, request: Request, decode_instances: Sequence[InstanceView], now: float) -> BindingDecision:
        """Choose the decode instance of ``request`` and record the session's binding.

        Raises ValueError when ``decode_instances`` is empty. The decision goes to the trace sink.
        """
        self._forget_idle(now)
        decision = self._bind(request, decode_instances)
        if decision.session_id:
            self._touch(decision.session_id, decision.instance_id, now)
            if len(self._bound) > self.config.max_sessions:
                self._forget_idle(now)
        emit(self.trace, "binding", now, decision)
        return decision

    def _bind(self, request: Request, decode_instances: Sequence[InstanceView]) -> BindingDecision:
        if not decode_instances:
            raise ValueError("no decode instances to bind to")
        sid = request.session_id
        bound_id = self._bound.get(sid) if sid else None
        if bound_id is None:
            chosen, reason = self._pick(request, decode_instances)
            return BindingDecision(sid, chosen, new_binding=bool(sid), reason=reason)

        by_id = {v.instance_id: v for v in decode_instances}
        bound = by_id.get(bound_id)
        if bound is not None and self._has_room(request, bound, self.config.rebind_headroom_fraction):
            return BindingDecision(sid, bound_id, reason="sticky: bound instance has room")
        others = [v for v in decode_instances if v.instance_id != bound_id]
        candidates = [v for v in others if self._has_room(request, v, 0.0)]
        if bound is not None and not candidates:
            return BindingDecision(
                sid, bound_id, reason="bound instance is full but no other has room: stays"
            )
        chosen, why = self._pick(request, candidates or decode_instances)
        cause = "bound instance gone" if bound is None else "bound instance out of KV room"
        move = bound is not None and history_follows(self.config, bound_id, chosen)
        if move:
            why += "; history KV follows"
        return BindingDecision(
            sid, chosen, rebound=True, from_instance=bound_id, reason=f"{cause}; {why}", move_history=move
        )

    @staticmethod
    def _room(request: Request, view: InstanceView) -> int:
        """Free blocks ``view`` would have left after taking ``request`` (a prefix lookup)."""
        return view.free_blocks - blocks_needed(request, view)

    @staticmethod
    def _keeps(room: int, view: InstanceView, headroom_fraction: float) -> bool:
        """Whether ``room`` left on ``view`` is at least ``headroom_fraction`` of its blocks."""
        return room >= headroom_fraction * view.total_blocks

    def _has_room(self, request: Request, view: InstanceView, headroom_fraction: float) -> bool:
        return self._keeps(self._room(request, view), view, headroom_fraction)

    def _pick(self, request: Request, instances: Sequence[InstanceView]) -> tuple[str, str]:
        left = [(v, self._room(request, v)) for v in instances]  # each instance's lookup once
        fraction = self.config.kv_headroom_fraction
        roomy = [(v, room) for v, room in left if self._keeps(room, v, fraction)]
        if roomy:
            best = min(roomy, key=lambda vr: (vr[0].num_running + vr[0].num_waiting, -vr[1], vr[0].instance_id))[0]
            return best.instance_id, "least loaded instance with KV headroom"
        best = min(left, key=lambda vr: (-vr[1], vr[0].instance_id))[0]
        return best.instance_id, "no instance has KV headroom: most free blocks"
