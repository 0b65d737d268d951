"""Drive sessions against one or more targets: open-loop session arrivals or a fixed number of
sessions in flight, closed-loop turns within a session (send, stream the answer, wait the next
turn's think time, send the next turn with the answer in its history)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenomy.bench.bodies import API_PATHS, auth_headers, request_body
from tokenomy.bench.client import AiohttpOpener, Clock, Opener, Outcome, WallClock, send
from tokenomy.bench.config import BenchConfig
from tokenomy.bench.sizing import AnswerCounter
from tokenomy.bench.text import PromptBuilder, PromptSizing
from tokenomy.core import Segment, Session, Turn
from tokenomy.policy.closedloop.retry import RETRY_COUNT_HEADER, RETRY_STATUSES

ResultFn = Callable[["TurnResult"], None]

RETRIED_AS = {"529": "503"}
"""Refusals retried as another status: Anthropic's 529 ``overloaded_error`` is a 503 (the anthropic
SDK retries both; :class:`~tokenomy.policy.closedloop.RetryPolicy` names 429 and 503)."""


def refusal_status(status: str) -> str:
    """``status`` as the retry rule reads it."""
    return RETRIED_AS.get(status, status)


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One sent turn: which session and turn, what the workload asked for, what came back (after
    the client's retries of a refusal: one result per turn, however many attempts it took)."""

    session_id: str
    index: int
    turn: Turn
    target: str
    outcome: Outcome
    tenant: str = "default"
    tier: str = ""
    first_sent_s: float | None = None
    """When the turn's first attempt was sent (its TTFT counts from there); None: ``outcome.sent_s``."""
    retried: tuple[str, ...] = ()
    """Statuses of the refused attempts that were sent again (``outcome`` is the last attempt's)."""

    @property
    def sent_s(self) -> float:
        return self.outcome.sent_s if self.first_sent_s is None else self.first_sent_s

    @property
    def abandoned(self) -> bool:
        """Refused past its retries (or not retryable): the session ends here."""
        return refusal_status(self.outcome.status) in RETRY_STATUSES


class BenchRun:
    """One run of ``sessions`` against ``config.targets``.

    Session i is pinned to target ``i mod len(targets)`` (its history lives in that target's
    prefix cache). A refused turn (429, 503; Messages' 529) is sent again after the ``retry-after``
    it got, up to ``config.retry.max_retries`` times (:class:`~tokenomy.policy.closedloop.RetryPolicy`). A
    session ends early when one of its turns fails for good: without the answer the next turn's
    history cannot be sent. ``run`` returns the results in completion order and the clock
    time the run started at. ``sizing`` sizes prompts in the target's tokens
    (:mod:`tokenomy.bench.sizing`; default: one token per filler word, no template tokens).
    """

    def __init__(
        self,
        sessions: Sequence[Session],
        config: BenchConfig,
        *,
        clock: Clock | None = None,
        opener: Opener | None = None,
        on_result: ResultFn | None = None,
        sizing: PromptSizing | None = None,
    ) -> None:
        if not sessions:
            raise ValueError("the workload produced no sessions")
        self.sessions = list(sessions)
        self.config = config
        self.clock = clock or WallClock()
        self._opener = opener
        self._on_result = on_result
        self.sizing = sizing or PromptSizing()
        self._counter = AnswerCounter(self.sizing, config.model)
        self._builder = PromptBuilder(self.sessions, seed=config.seed, sizing=self.sizing,
                                      chat=config.api != "completions")
        self.results: list[TurnResult] = []
        self.t0 = 0.0
        self._urls = [t + API_PATHS[config.api] for t in config.targets]
        missing = sorted({s.tenant for s in self.sessions if config.key_of(s.tenant) is None}) if config.tenant_keys else []
        if missing:
            raise ValueError(f"--tenant-keys gives no key for tenant(s) {', '.join(missing)} and no --api-key is set")

    def _expired(self) -> bool:
        return self.config.concurrency is not None and self.clock.now() - self.t0 >= self.config.duration_s

    async def _session(self, opener: Opener, index: int, session: Session) -> None:
        url = self._urls[index % len(self._urls)]
        key = self.config.key_of(session.tenant)
        auth = auth_headers(self.config.api, key)
        answer: tuple[Turn, tuple[Segment, ...], str, asyncio.Task[int | None] | None] | None = None
        try:
            for k, turn in enumerate(session.turns):
                if k > 0:
                    await self.clock.sleep(turn.think_time_s)
                if answer is not None:
                    # The previous answer was counted in the target's tokens during the think time.
                    prev, content, text, counting = answer
                    self._builder.record_answer(prev, content, text, await counting if counting else None)
                    answer = None
                if self._expired():
                    return
                prompt, content = self._builder.prompt(turn)
                body = request_body(self.config, prompt, turn.output_tokens, session.session_id)
                rid = f"{session.session_id}:{k}"
                retried: list[str] = []
                first_sent: float | None = None
                while True:  # a refusal is sent again after its retry-after (config.retry), then abandoned
                    headers = {**auth, "x-session-id": session.session_id,  # the SDKs' retry count too
                               "x-request-id": f"{rid}:retry{len(retried)}" if retried else rid,
                               RETRY_COUNT_HEADER: str(len(retried))}
                    outcome = await send(opener, url, body, headers, self.clock, self.config.api)
                    first_sent = outcome.sent_s if first_sent is None else first_sent
                    delay = None if outcome.ok else self.config.retry.delay_for(
                        len(retried), refusal_status(outcome.status), outcome.headers)
                    if delay is None:
                        break
                    retried.append(outcome.status)
                    await self.clock.sleep(delay)
                result = TurnResult(session.session_id, k, turn, url, outcome, session.tenant, session.tier,
                                    first_sent, tuple(retried))
                self.results.append(result)
                if self._on_result is not None:
                    self._on_result(result)
                if not outcome.ok:
                    return
                if k + 1 < len(session.turns):
                    counting = (asyncio.ensure_future(self._counter.count(opener, outcome.text, auth))
                                if self._counter.active else None)
                    answer = (turn, content, outcome.text, counting)
        finally:
            if answer is not None and answer[3] is not None:
                answer[3].cancel()

    async def _open_loop(self, opener: Opener) -> None:
        async def start(i: int, s: Session) -> None:
            await self.clock.sleep(self.t0 + s.start_s - self.clock.now())
            await self._session(opener, i, s)

        await asyncio.gather(*(start(i, s) for i, s in enumerate(self.sessions)))

    async def _closed_loop(self, opener: Opener, concurrency: int) -> None:
        queue = deque(enumerate(self.sessions))

        async def worker() -> None:
            while queue and not self._expired():
                i, s = queue.popleft()
                await self._session(opener, i, s)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def run(self) -> list[TurnResult]:
        """Send every turn (or until the duration runs out) and return the results."""
        own = AiohttpOpener(self.config) if self._opener is None else None
        opener: Opener = own if own is not None else self._opener  # type: ignore[assignment]
        self.t0 = self.clock.now()
        try:
            if self.config.concurrency is None:
                await self._open_loop(opener)
            else:
                await self._closed_loop(opener, self.config.concurrency)
        finally:
            if own is not None:
                await own.close()
        return self.results
