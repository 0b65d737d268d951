"""A fake OpenAI-compatible server for the bench's tests: word tokens, a block prefix cache, fixed
TTFT and ITL on a simulated clock, scripted failures. Served in-process through an httpx transport
(:class:`FakeTransport`) or on a loopback port (:func:`serve_loopback`)."""

from __future__ import annotations

import asyncio
import heapq
import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from helpers.prefix_cache import shared_prefix
from helpers.threaded_http import serve_thread

BLOCK = 16
_TOKEN = re.compile(r" ?[A-Za-z]+|\S")


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


class FakeClock:
    """Simulated time for asyncio: ``sleep`` parks the caller until every other task is blocked
    too, then time jumps to the earliest wake-up (a discrete-event clock; no real waiting)."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.sleeps: list[float] = []
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0
        self._ticker: asyncio.Task[None] | None = None

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.sleeps.append(seconds)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._seq += 1
        heapq.heappush(self._heap, (self.t + max(0.0, seconds), self._seq, fut))
        if self._ticker is None or self._ticker.done():
            self._ticker = loop.create_task(self._tick())
        await fut

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0)
            while loop._ready:  # type: ignore[attr-defined]  # CPython: other tasks still runnable
                await asyncio.sleep(0)
            if not self._heap:
                return
            wake, _, fut = heapq.heappop(self._heap)
            self.t = max(self.t, wake)
            fut.set_result(None)


@dataclass
class FakeEngine:
    """Answers like vLLM with prefix caching; ``fail`` maps a request number (0-based, in
    arrival order) to an HTTP status to answer instead."""

    ttft_s: float = 0.05
    itl_s: float = 0.01
    fail: dict[int, int] = field(default_factory=dict)
    fail_headers: dict[int, dict[str, str]] = field(default_factory=dict)  # request number -> its headers
    bodies: list[dict[str, Any]] = field(default_factory=list)
    cached: list[list[str]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    def prompt_text(self, body: dict[str, Any]) -> str:
        if "messages" in body:
            return "".join(m["content"] for m in body["messages"])
        return str(body["prompt"])

    def hit_tokens(self, toks: list[str]) -> int:
        return shared_prefix(self.cached, toks) // BLOCK * BLOCK

    def answer(self, body: dict[str, Any]) -> tuple[int, list[str], dict[str, Any]]:
        """(status, answer words, usage) of one request; remembers prompt + answer for caching."""
        n = len(self.bodies)
        self.bodies.append(body)
        if n in self.fail:
            return self.fail[n], [], {}
        toks = tokens(self.prompt_text(body))
        words = [" z" + _alpha(n) + "q" + _alpha(i) for i in range(int(body["max_tokens"]))]
        usage = {"prompt_tokens": len(toks), "completion_tokens": len(words),
                 "total_tokens": len(toks) + len(words),
                 "prompt_tokens_details": {"cached_tokens": self.hit_tokens(toks)}}
        self.cached.append(toks + [w for w in words])
        return 200, words, usage

    def events(self, body: dict[str, Any], words: list[str], usage: dict[str, Any]) -> Iterator[tuple[bool, str]]:
        """``(carries a token, SSE event text)`` in stream order."""
        chat = "messages" in body
        if chat:
            yield False, _data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i, w in enumerate(words):
            last = i == len(words) - 1
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            choice.update({"delta": {"content": w}} if chat else {"text": w})
            yield True, _data({"choices": [choice]})
        yield False, _data({"choices": [], "usage": usage})
        yield False, "data: [DONE]\n\n"


def _alpha(n: int) -> str:
    """``n`` in base 26 with letters (answer words stay one token for :func:`tokens`)."""
    out = "a"
    while n:
        n, r = divmod(n, 26)
        out += chr(ord("a") + r)
    return out


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _error(status: int) -> bytes:
    return json.dumps({"error": {"message": f"fake {status}", "type": "fake", "param": None,
                                 "code": status}}).encode()


class _FakeResponse:
    def __init__(self, engine: FakeEngine, clock: FakeClock, body: dict[str, Any]) -> None:
        self.engine, self.clock, self.body = engine, clock, body
        self.status, self.words, self.usage = engine.answer(body)
        self.headers = engine.fail_headers.get(len(engine.bodies) - 1, {})

    async def read(self) -> bytes:
        return _error(self.status)

    async def lines(self) -> AsyncIterator[bytes]:
        eng = self.engine
        eng.in_flight += 1
        eng.max_in_flight = max(eng.max_in_flight, eng.in_flight)
        try:
            first = True
            for is_token, event in eng.events(self.body, self.words, self.usage):
                if is_token:
                    await self.clock.sleep(eng.ttft_s if first else eng.itl_s)
                    first = False
                for line in event.encode().splitlines(keepends=True):
                    yield line
        finally:
            eng.in_flight -= 1


class FakeOpener:
    """Serves a :class:`FakeEngine` in-process as the bench's opener; the stream advances
    ``clock`` by TTFT before the first token and by ITL before each later one, so measured
    latencies are exact."""

    def __init__(self, engine: FakeEngine, clock: FakeClock) -> None:
        self.engine = engine
        self.clock = clock
        self.urls: list[str] = []
        self.auth: dict[str, set[str]] = {}  # session id -> Authorization headers it sent
        self.sent: list[dict[str, str]] = []  # every request's headers, in order

    @asynccontextmanager
    async def __call__(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> AsyncIterator[_FakeResponse]:
        self.urls.append(url)
        self.auth.setdefault(headers.get("x-session-id", ""), set()).add(headers.get("Authorization", ""))
        self.sent.append(dict(headers))
        yield _FakeResponse(self.engine, self.clock, json.loads(json.dumps(body)))


@contextmanager
def serve_loopback(engine: FakeEngine) -> Iterator[str]:
    """Serve ``engine`` over real HTTP on 127.0.0.1 (free port, no delays); yields the base URL
    and always shuts the server down."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            payload = json.dumps({"object": "list", "data": [{"id": "fake-model"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            # Like an OpenAI server without vLLM's /tokenize: the bench's prompt sizing falls back.
            status, words, usage = engine.answer(body) if self.path.startswith("/v1/") else (404, [], {})
            if status != 200:
                payload = _error(status)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for _, event in engine.events(body, words, usage):
                raw = event.encode()
                self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

    with serve_thread(Handler) as url:
        yield url
