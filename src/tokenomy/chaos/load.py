"""The chaos run's clients: ``tokenomy bench`` sessions (chat, Messages, Responses) per key tier, and
clients that hang up mid-stream.

Each (tier, API) pair is one closed-loop :class:`~tokenomy.bench.runner.BenchRun` with the bench's
own request ids (``session:turn``) under a prefix unique to the run, and no retries: every attempt
is one offered request. Clients reach the replicas the way a load balancer's health check would
let them: a connection refused by a dead replica goes to the next one (no byte of the request was
sent); a connection that breaks after the request went out is a failure the client sees.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tokenomy.bench.bodies import API_PATHS
from tokenomy.bench.client import KEEPALIVE_S, RawResponse
from tokenomy.bench.config import BenchConfig
from tokenomy.bench.runner import BenchRun, TurnResult
from tokenomy.chaos.stack import MODEL
from tokenomy.core import Session
from tokenomy.policy.closedloop.retry import RetryPolicy
from tokenomy.workload.registry import load_workload

APIS = ("chat", "messages", "responses")
MAX_OUTPUT_TOKENS = 48
"""Answers are capped at this many tokens: the run is about the fleet, not the engines' speed."""


@dataclass(frozen=True)
class Request:
    """One request a client sent, as the client saw it (times on the run's clock)."""

    request_id: str
    tier: str
    api: str
    status: str  # "ok", an HTTP status, or a transport failure ("connect_error", "read_error", ...)
    sent_s: float
    end_s: float
    code: str = ""  # the error code of a refusal, as the protocol carries it
    shape_ok: bool = True  # a refusal's body is in the protocol's own error shape
    ttft_s: float | None = None
    disconnected: bool = False  # the client hung up mid-stream on purpose

    @property
    def complete(self) -> bool:
        return self.status == "ok"


def error_code(api: str, raw: bytes) -> tuple[str, bool]:
    """(code, in the protocol's shape) of an error body: OpenAI's ``{"error": {"message", "type",
    "code"}}`` (chat, Responses) or Anthropic's ``{"type": "error", "error": {"type", "message"}}``."""
    try:
        body = json.loads(raw)
    except ValueError:
        return "not_json", False
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str) or not isinstance(err.get("type"), str):
        return "bad_shape", False
    if api == "messages":
        return str(err["type"]), body.get("type") == "error"
    return str(err.get("code") or err["type"]), True


class _Recorded:
    """A response whose error body is read once and its code kept."""

    def __init__(self, resp: aiohttp.ClientResponse, on_error: Any, pause_s: float) -> None:
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers
        self._resp = resp
        self._on_error = on_error
        self._pause_s = pause_s

    async def read(self) -> bytes:
        raw = await self._resp.read()
        if self.status != 200:
            self._on_error(raw)
            await asyncio.sleep(self._pause_s)  # a client backs off after a refusal (no busy loop)
        return raw

    async def lines(self) -> AsyncIterator[bytes]:
        async for line in self._resp.content:
            yield line


class FailoverOpener:
    """The bench's opener over ``bases`` (the replicas): a refused connection moves on to the next
    replica; the error bodies' codes go to ``codes`` by request id."""

    def __init__(self, bases: list[str], timeout_s: float, pause_s: float = 0.5) -> None:
        self.bases = bases
        self.pause_s = pause_s
        self.codes: dict[str, tuple[str, bool]] = {}
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=5.0))

    @asynccontextmanager
    async def __call__(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> AsyncIterator[RawResponse]:
        first = next(i for i, b in enumerate(self.bases) if url.startswith(b))
        path = url[len(self.bases[first]):]
        api = next(a for a, p in API_PATHS.items() if p == path)
        rid = headers.get("x-request-id", "")
        error: aiohttp.ClientConnectorError | None = None
        for k in range(len(self.bases)):
            base = self.bases[(first + k) % len(self.bases)]
            try:
                resp = await self._session.post(base + path, json=body, headers=headers)
            except aiohttp.ClientConnectorError as e:  # refused: nothing was sent, the next replica may take it
                error = e
                continue
            try:
                yield _Recorded(resp, lambda raw: self.codes.__setitem__(rid, error_code(api, raw)), self.pause_s)
            finally:
                resp.release()
            return
        assert error is not None
        raise error

    async def close(self) -> None:
        await self._session.close()


@dataclass
class Load:
    """``concurrency`` sessions in flight per (tier, API), for ``duration_s``; ``t0`` is the run's
    start (``time.perf_counter``)."""

    bases: list[str]
    keys: dict[str, str]  # tier -> raw API key
    duration_s: float
    prefix: str
    t0: float
    seed: int = 0
    concurrency: dict[str, int] = field(default_factory=lambda: {"open": 2, "budgeted": 2, "capped": 1})
    request_timeout_s: float = 120.0
    requests: list[Request] = field(default_factory=list)
    _opener: FailoverOpener | None = None
    _hangups: int = 0

    def _sessions(self, tier: str, api: str, n: int) -> list[Session]:
        sessions = load_workload("toolbench", rate_per_s=1.0, duration_s=2.0 * n + 10, seed=self.seed, max_sessions=n)
        return [dataclasses.replace(
            s, session_id=f"{self.prefix}-{tier}-{api}-{i}",
            turns=tuple(dataclasses.replace(t, output_tokens=min(t.output_tokens, MAX_OUTPUT_TOKENS)) for t in s.turns))
            for i, s in enumerate(sessions)]

    def _record(self, tier: str, api: str, r: TurnResult) -> None:
        rid = f"{r.session_id}:{r.index}"
        o = r.outcome
        code, shape_ok = self._opener.codes.pop(rid, ("", True)) if self._opener else ("", True)
        ttft = o.token_times_s[0] - o.sent_s if o.token_times_s else None
        self.requests.append(Request(rid, tier, api, o.status, o.sent_s - self.t0,
                                     (o.finish_s or time.perf_counter()) - self.t0, code, shape_ok, ttft))

    async def run(self) -> None:
        self._opener = FailoverOpener(self.bases, self.request_timeout_s)
        runs = []
        for tier, conc in self.concurrency.items():
            for api in APIS:
                n = max(20, int(self.duration_s * conc * 1.5))
                config = BenchConfig(targets=tuple(self.bases), model=MODEL, api=api, api_key=self.keys[tier],
                                     concurrency=conc, duration_s=self.duration_s, seed=self.seed,
                                     request_timeout_s=self.request_timeout_s, retry=RetryPolicy(max_retries=0))
                runs.append(BenchRun(self._sessions(tier, api, n), config, opener=self._opener,
                                     on_result=functools.partial(self._record, tier, api)))
        try:
            await asyncio.gather(*(r.run() for r in runs))
        finally:
            await self._opener.close()

    async def disconnects(self, duration_s: float, every_s: float = 0.5) -> None:
        """For ``duration_s``: every ``every_s`` a streamed chat request that hangs up after its first chunk."""
        end = time.perf_counter() + duration_s
        tasks: list[asyncio.Future[None]] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as session:
            while time.perf_counter() < end:
                self._hangups += 1
                rid = f"{self.prefix}-hangup-{self._hangups}"
                base = self.bases[self._hangups % len(self.bases)]
                tasks.append(asyncio.ensure_future(self._hang_up(session, base, rid)))
                await asyncio.sleep(every_s)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _hang_up(self, session: aiohttp.ClientSession, base: str, rid: str) -> None:
        body = {"model": MODEL, "stream": True, "max_tokens": 400, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Tell me a long story about a ledger."}]}
        headers = {"authorization": f"Bearer {self.keys['open']}", "x-request-id": rid}
        sent = time.perf_counter() - self.t0
        status = "hung_up"
        try:
            async with session.post(base + API_PATHS["chat"], json=body, headers=headers) as resp:
                if resp.status != 200:
                    status = str(resp.status)
                else:
                    async for line in resp.content:
                        if line.startswith(b"data:") and b"content" in line:
                            break
                    resp.close()  # hang up mid-stream
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            status = type(e).__name__
        self.requests.append(Request(rid, "open", "chat_hangup", status, sent, time.perf_counter() - self.t0,
                                     disconnected=True))
