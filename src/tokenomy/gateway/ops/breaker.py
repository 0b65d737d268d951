"""Agent circuit breakers, per session and per key: stop a runaway agent within a token.

Four trips, each a ``GatewayError`` (429, ``type="rate_limit_error"``) with its own ``code`` and a
``retry-after`` cooldown during which every request of that session (or key) is refused:

* ``breaker_turn_cap``: a session's turn count reaches ``max_turns_per_session``;
* ``breaker_repetition``: the same prompt fingerprint (tool call / prompt tail) arrives
  ``repeat_limit`` times in a row — the request that would be the ``repeat_limit``-th is refused;
* ``breaker_velocity``: tokens (prompt at admission, output as streamed) within the last
  ``velocity_window_s`` exceed the session's or the key's cap;
* ``breaker_session_budget``: a session's spend (settled + in flight) reaches ``session_budget_usd``.

Mid-stream, ``on_tokens`` returns False the moment a streamed request crosses the velocity cap or
its session budget (``Admission.output_token_cap``), so the request path cuts it at once.
Session state is bounded (least recently used sessions are forgotten past ``max_sessions``).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from tokenomy.gateway.errors import GatewayError


class BreakerConfig(BaseModel):
    """Caps; ``None`` turns a check off. Labelled defaults: generous, meant to be tuned per fleet."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_turns_per_session: int | None = Field(default=500, ge=1)
    repeat_limit: int | None = Field(default=8, ge=2)
    session_tokens_per_min: int | None = Field(default=None, ge=1)
    key_tokens_per_min: int | None = Field(default=None, ge=1)
    session_budget_usd: float | None = Field(default=None, gt=0)
    velocity_window_s: float = Field(default=60.0, gt=0)
    cooldown_s: float = Field(default=60.0, gt=0)
    max_sessions: int = Field(default=100_000, ge=1)


@dataclass(slots=True)
class _Window:
    """Tokens seen in a sliding time window."""

    events: deque[tuple[float, int]] = field(default_factory=deque)
    total: int = 0

    def add(self, now_s: float, n: int, window_s: float) -> int:
        self.events.append((now_s, n))
        self.total += n
        while self.events and self.events[0][0] <= now_s - window_s:
            self.total -= self.events.popleft()[1]
        return self.total


@dataclass(slots=True)
class _State:
    turns: int = 0
    last_fingerprint: str | None = None
    repeats: int = 0
    spent_usd: float = 0.0
    in_flight_usd: float = 0.0
    window: _Window = field(default_factory=_Window)
    open_until_s: float = -math.inf
    open_code: str = ""
    open_reason: str = ""


def breaker_open(subject: str, code: str, reason: str, wait_s: float) -> GatewayError:
    """The 429 of an open breaker (``subject``: ``key k1`` or ``session 's1'``)."""
    secs = max(1, math.ceil(wait_s))
    return GatewayError(429, f"circuit breaker open for {subject}: {reason}; retry after {secs} s",
                        type="rate_limit_error", code=code, headers={"retry-after": str(secs)})


def over_budget(spent_usd: float, need_usd: float, budget_usd: float) -> bool:
    """A session's budget is spent, or cannot pay for what the next request needs."""
    return spent_usd >= budget_usd or (need_usd > 0 and spent_usd + need_usd > budget_usd)


@dataclass(frozen=True, slots=True)
class Trip:
    """A breaker that opened: who, why, until when (for alerts and metrics)."""

    scope: str  # "session" or "key"
    subject: str
    code: str
    reason: str
    until_s: float


@dataclass(frozen=True, slots=True)
class SessionStatus:
    turns: int
    spent_usd: float
    open: bool
    code: str
    reason: str
    open_until_s: float | None


class Breakers:
    """Per-session and per-key breaker state. Not thread-safe; one event loop owns it."""

    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self._sessions: OrderedDict[tuple[str, str], _State] = OrderedDict()
        self._keys: dict[str, _State] = {}
        self.trips: list[Trip] = []  # drained by the owner (alerts/metrics)

    def _session(self, key_id: str, session_id: str) -> _State:
        k = (key_id, session_id)
        state = self._sessions.get(k)
        if state is None:
            state = self._sessions[k] = _State()
            if len(self._sessions) > self.config.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(k)
        return state

    def _trip(self, state: _State, scope: str, subject: str, code: str, reason: str, now_s: float) -> None:
        if now_s < state.open_until_s:
            return  # already open: one trip, one alert
        state.open_until_s = now_s + self.config.cooldown_s
        state.open_code, state.open_reason = code, reason
        self.trips.append(Trip(scope, subject, code, reason, state.open_until_s))

    def _refuse_if_open(self, state: _State, subject: str, now_s: float) -> None:
        if now_s < state.open_until_s:
            raise breaker_open(subject, state.open_code, state.open_reason, state.open_until_s - now_s)

    def admit_check(self, key_id: str, session_id: str | None, fingerprint: str | None, now_s: float,
                    need_usd: float = 0.0) -> None:
        """Refuse (GatewayError) a request an open or newly tripped breaker stops; counts nothing.
        ``need_usd``: what the request needs of its session's budget (its prompt and one output
        token); a session with less left trips."""
        cfg = self.config
        self._refuse_if_open(self._keys.setdefault(key_id, _State()), f"key {key_id}", now_s)
        if session_id is None:
            return
        subject = f"session {session_id!r}"
        s = self._session(key_id, session_id)
        self._refuse_if_open(s, subject, now_s)
        if cfg.max_turns_per_session is not None and s.turns >= cfg.max_turns_per_session:
            self._trip(s, "session", session_id, "breaker_turn_cap",
                       f"{s.turns} turns reached the cap of {cfg.max_turns_per_session}", now_s)
        elif cfg.repeat_limit is not None and fingerprint is not None and fingerprint == s.last_fingerprint \
                and s.repeats + 1 >= cfg.repeat_limit:
            self._trip(s, "session", session_id, "breaker_repetition",
                       f"the same call repeated {s.repeats + 1} times in a row", now_s)
            s.last_fingerprint, s.repeats = None, 0
        elif cfg.session_budget_usd is not None and over_budget(s.spent_usd + s.in_flight_usd, need_usd,
                                                                cfg.session_budget_usd):
            self._trip(s, "session", session_id, "breaker_session_budget",
                       f"session spent ${s.spent_usd:.4f} of ${cfg.session_budget_usd:.4f}", now_s)
        self._refuse_if_open(s, subject, now_s)

    def admit_count(self, key_id: str, session_id: str | None, fingerprint: str | None, prompt_tokens: int,
                    worst_cost_usd: float, now_s: float) -> None:
        """Count an admitted request: a turn, its fingerprint, its prompt tokens, its worst cost.

        The request that pushes a velocity window over its cap is let through (its stream is cut
        by ``on_tokens`` if it keeps going); the breaker is open for the next one.
        """
        key = self._keys.setdefault(key_id, _State())
        s = None if session_id is None else self._session(key_id, session_id)
        self._velocity(key, s, key_id, session_id, prompt_tokens, now_s)
        if s is not None:
            s.turns += 1
            same = fingerprint is not None and fingerprint == s.last_fingerprint
            s.last_fingerprint, s.repeats = fingerprint, (s.repeats + 1 if same else 1)
            s.in_flight_usd += worst_cost_usd

    def key_tokens_per_s(self, key_id: str, now_s: float) -> float:
        """The key's recent token rate (prompt + output) over the velocity window."""
        key = self._keys.get(key_id)
        if key is None:
            return 0.0
        w = key.window
        while w.events and w.events[0][0] <= now_s - self.config.velocity_window_s:
            w.total -= w.events.popleft()[1]
        return w.total / self.config.velocity_window_s

    def session_spend_usd(self, key_id: str, session_id: str) -> float:
        """The session's settled spend plus its requests' worst cases in flight."""
        s = self._session(key_id, session_id)
        return s.spent_usd + s.in_flight_usd

    def session_status(self, key_id: str, session_id: str, now_s: float) -> SessionStatus | None:
        """A session's breaker as the console shows it (None: not tracked); reads, never refreshes
        the session's place in the LRU order."""
        s = self._sessions.get((key_id, session_id))
        if s is None:
            return None
        is_open = now_s < s.open_until_s
        return SessionStatus(s.turns, s.spent_usd, is_open, s.open_code if is_open else "",
                             s.open_reason if is_open else "", s.open_until_s if is_open else None)

    def _velocity(self, key: _State, s: _State | None, key_id: str, session_id: str | None, n: int,
                  now_s: float) -> bool:
        """Add ``n`` tokens; trip and return False when a velocity cap is crossed."""
        cfg = self.config
        ok = True
        key_total = key.window.add(now_s, n, cfg.velocity_window_s)  # always kept: a routing signal
        if cfg.key_tokens_per_min is not None:
            cap = cfg.key_tokens_per_min * cfg.velocity_window_s / 60.0
            if key_total > cap:
                self._trip(key, "key", key_id, "breaker_velocity",
                           f"more than {cfg.key_tokens_per_min} tokens/min on key {key_id}", now_s)
                ok = False
        if s is not None and session_id is not None and cfg.session_tokens_per_min is not None:
            cap = cfg.session_tokens_per_min * cfg.velocity_window_s / 60.0
            if s.window.add(now_s, n, cfg.velocity_window_s) > cap:
                self._trip(s, "session", session_id, "breaker_velocity",
                           f"more than {cfg.session_tokens_per_min} tokens/min in session", now_s)
                ok = False
        return ok

    def on_tokens(self, key_id: str, session_id: str | None, n: int, now_s: float) -> bool:
        """Count streamed output tokens; False when a velocity cap is crossed (cut the stream)."""
        key = self._keys.setdefault(key_id, _State())
        s = self._session(key_id, session_id) if session_id is not None else None
        return self._velocity(key, s, key_id, session_id, n, now_s)

    def budget_crossed(self, key_id: str, session_id: str, now_s: float) -> None:
        """A stream hit its session-budget cap: open the session's breaker."""
        s = self._session(key_id, session_id)
        self._trip(s, "session", session_id, "breaker_session_budget",
                   f"a streamed answer crossed the session budget of ${self.config.session_budget_usd}", now_s)

    def finish(self, key_id: str, session_id: str | None, worst_cost_usd: float, actual_usd: float,
               undo_turn: bool = False) -> None:
        """A request ended: replace its in-flight worst case by its actual cost. ``undo_turn``: it
        was refused after ``admit_count`` (shed from the queue) and does not count as a turn."""
        if session_id is None:
            return
        s = self._session(key_id, session_id)
        s.in_flight_usd = max(0.0, s.in_flight_usd - worst_cost_usd)
        s.spent_usd += actual_usd
        if undo_turn:
            s.turns = max(0, s.turns - 1)
