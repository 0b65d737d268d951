"""Sessions, turns and requests.

Token identity without token ids: a prompt followed by its output is described by
``content``, a tuple of :data:`Segment` ``(stream_key, n_tokens)``. A *stream* is an
append-only sequence of tokens (a shared system prompt, or one session's growing
conversation); a segment is the next ``n_tokens`` of that stream, starting where the
previous segment of the same stream in this tuple ended (or at 0). Two requests whose
content starts with the same segments share that prefix, which is what prefix caching
keys on. A session's turn k+1 lists the same stream with a longer length, so it
reuses the KV of turn k's prompt *and output*.
"""

from __future__ import annotations

from dataclasses import dataclass

Segment = tuple[int, int]
"""``(stream_key, n_tokens)``: the next ``n_tokens`` tokens of content stream ``stream_key``."""


def content_tokens(content: tuple[Segment, ...]) -> int:
    """Total tokens a content tuple describes."""
    return sum(n for _, n in content)


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session, as a workload describes it.

    ``think_time_s`` is the delay between the end of the previous turn's answer and this
    turn's arrival (tool latency or user think time); it is ignored for the first turn.
    ``history_tokens`` is the part of the prompt carried over from earlier turns (previous
    prompts and answers); the rest, ``prompt_tokens - history_tokens``, is new input
    (first turn) or incremental prefill (later turns).
    """

    prompt_tokens: int
    output_tokens: int
    history_tokens: int = 0
    think_time_s: float = 0.0
    content: tuple[Segment, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens}")
        if not 0 <= self.history_tokens <= self.prompt_tokens:
            raise ValueError(
                f"history_tokens must be in [0, prompt_tokens={self.prompt_tokens}], got {self.history_tokens}"
            )
        if self.think_time_s < 0:
            raise ValueError(f"think_time_s must be >= 0, got {self.think_time_s}")
        if self.content and content_tokens(self.content) < self.prompt_tokens:
            raise ValueError("content must cover at least the prompt tokens")

    @property
    def new_tokens(self) -> int:
        """Prompt tokens that were not context of an earlier turn."""
        return self.prompt_tokens - self.history_tokens


@dataclass(frozen=True, slots=True)
class Session:
    """A conversation or agent run: turns issued one after another (closed loop).

    ``tenant`` is who pays; ``tier`` its service class (``""``: none, admission treats it as the
    lowest tier). ``budget_tokens`` (prompt + output tokens the tenant may use over the run) and
    ``rate_limit_tokens_per_s`` are the tenant's, repeated on each of its sessions (None: none).
    """

    session_id: str
    start_s: float
    turns: tuple[Turn, ...]
    tenant: str = "default"
    priority: int = 0
    tier: str = ""
    budget_tokens: int | None = None
    rate_limit_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError(f"session {self.session_id!r} has no turns")
        if self.start_s < 0:
            raise ValueError(f"start_s must be >= 0, got {self.start_s}")
        if self.budget_tokens is not None and self.budget_tokens < 1:
            raise ValueError(f"budget_tokens must be >= 1, got {self.budget_tokens}")
        if self.rate_limit_tokens_per_s is not None and not self.rate_limit_tokens_per_s > 0:
            raise ValueError(f"rate_limit_tokens_per_s must be > 0, got {self.rate_limit_tokens_per_s}")


@dataclass(slots=True)
class Request:
    """One inference request handed to the serving system.

    Immutable in spirit: engines keep their own progress state and never mutate it.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    max_output_tokens: int
    session_id: str = ""
    turn: int = 0
    history_tokens: int = 0
    content: tuple[Segment, ...] = ()
    tenant: str = "default"
    priority: int = 0
    tier: str = ""

    @classmethod
    def from_turn(cls, session: Session, index: int, arrival_s: float) -> Request:
        turn = session.turns[index]
        return cls(
            request_id=f"{session.session_id}:{index}",
            arrival_s=arrival_s,
            prompt_tokens=turn.prompt_tokens,
            max_output_tokens=turn.output_tokens,
            session_id=session.session_id,
            turn=index,
            history_tokens=turn.history_tokens,
            content=turn.content,
            tenant=session.tenant,
            priority=session.priority,
            tier=session.tier,
        )

    @property
    def new_tokens(self) -> int:
        return self.prompt_tokens - self.history_tokens
