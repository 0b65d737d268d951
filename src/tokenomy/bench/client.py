"""One streamed request (OpenAI chat or completions, Anthropic Messages, OpenAI Responses), timed on the
bench's clock."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from tokenomy.bench.config import BenchConfig
from tokenomy.bench.sse import StreamError, parse_usage, stream_state

OK = "ok"

KEEPALIVE_S = 4.0
"""Seconds an idle pooled connection is kept; below uvicorn's default keep-alive of 5 s (vLLM,
SGLang and our emulator serve with uvicorn), so agent think times never reuse a closing one."""


class Clock(Protocol):
    """Where the bench reads time and waits; tests pass a simulated one."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    """The real clock: monotonic seconds, asyncio sleep."""

    def now(self) -> float:
        return time.perf_counter()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


@dataclass
class Outcome:
    """What one request returned. ``status`` is ``"ok"``, an HTTP status (``"429"``), or a
    transport failure (``"timeout"``, ``"connect_error"``, ``"read_error"``, ``"bad_stream"``,
    ``"empty_answer"``, see docs/bench.md). Times are on the bench clock."""

    status: str
    sent_s: float
    token_times_s: list[float] = field(default_factory=list)
    finish_s: float | None = None
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    usage_reported: bool = False
    message: str = ""
    choice_times_s: list[float] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    """A refusal's retry headers (``retry-after``, ``x-should-retry``; lower-case names)."""

    @property
    def ok(self) -> bool:
        return self.status == OK


def _error_message(raw: bytes) -> str:
    """The message of an error answer: OpenAI's ``{"error": {"message"}}`` and Anthropic's
    ``{"type": "error", "error": {"type", "message"}}`` alike."""
    try:
        err = json.loads(raw).get("error", {})
        return str(err.get("message", "")) if isinstance(err, dict) else str(err)
    except Exception:
        return raw[:200].decode("utf-8", "replace")


RETRY_HEADERS = ("retry-after", "x-should-retry")


def _retry_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers a client's retry rule reads (:class:`~tokenomy.policy.closedloop.RetryPolicy`)."""
    return {h: str(v) for h in RETRY_HEADERS if (v := headers.get(h)) is not None}


class RawResponse(Protocol):
    """An HTTP response as :func:`send` reads it: status, then either the whole body or lines."""

    status: int
    headers: Mapping[str, str]

    async def read(self) -> bytes: ...

    def lines(self) -> AsyncIterator[bytes]: ...


Opener = Callable[[str, dict[str, Any], dict[str, str]], AbstractAsyncContextManager[RawResponse]]
"""``opener(url, json_body, headers)``: POST and yield the response while its body streams in."""


class _AioResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers
        self._resp = resp

    async def read(self) -> bytes:
        return await self._resp.read()

    async def lines(self) -> AsyncIterator[bytes]:
        async for line in self._resp.content:
            yield line


class AiohttpOpener:
    """The production :data:`Opener`: one pooled aiohttp session (its C HTTP parser keeps the
    bench's cost per streamed chunk low). Create and :meth:`close` it inside the running loop."""

    def __init__(self, config: BenchConfig) -> None:
        self._session = aiohttp.ClientSession(
            # Idle pooled connections are dropped after KEEPALIVE_S, before the server's own keep-alive
            # timeout closes them: reusing a connection the server is closing fails the request.
            connector=aiohttp.TCPConnector(limit=config.max_connections, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=config.request_timeout_s),
        )

    @asynccontextmanager
    async def __call__(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> AsyncIterator[RawResponse]:
        async with self._session.post(url, json=body, headers=headers) as resp:
            yield _AioResponse(resp)

    async def close(self) -> None:
        await self._session.close()


async def send(opener: Opener, url: str, body: dict[str, Any], headers: dict[str, str], clock: Clock,
               api: str = "chat") -> Outcome:
    """POST ``body`` to ``url`` and read its event stream (``api``'s events) to the end; never raises
    for a failed request (the failure is the Outcome's status)."""
    sent = clock.now()
    state = stream_state(api)
    try:
        async with opener(url, body, headers) as resp:
            if resp.status != 200:
                raw = await resp.read()
                return Outcome(str(resp.status), sent, finish_s=clock.now(), message=_error_message(raw),
                               headers=_retry_headers(resp.headers))
            async for line in resp.lines():
                state.feed_line(line.decode("utf-8", "replace").rstrip("\r\n"), clock.now())
    except StreamError as exc:
        return Outcome(exc.status, sent, state.token_times_s, clock.now(), state.text, message=str(exc))
    except ValueError as exc:
        return Outcome("bad_stream", sent, state.token_times_s, clock.now(), state.text, message=str(exc))
    except TimeoutError as exc:
        return Outcome("timeout", sent, state.token_times_s, None, state.text, message=repr(exc))
    except aiohttp.ClientConnectorError as exc:
        return Outcome("connect_error", sent, message=repr(exc))
    except (aiohttp.ClientError, OSError) as exc:
        return Outcome("read_error", sent, state.token_times_s, None, state.text, message=repr(exc))
    finish = clock.now()
    usage = parse_usage(state.usage)
    out = Outcome(OK, sent, state.token_times_s, finish, state.text, choice_times_s=state.choice_times_s)
    if not state.token_times_s:
        out.status, out.message = "empty_answer", "the stream carried no generated text"
    if usage is not None:
        out.prompt_tokens, out.completion_tokens, out.cached_tokens = usage
        out.usage_reported = True
    return out
