"""Server-sent-event pass-through with metering, hard caps and disconnect handling, for every
protocol (its adapter reads the events: :mod:`tokenomy.gateway.http.adapter`).

Each upstream event is forwarded as the same bytes, in order, except the events that tell the
client the request is complete (chat: the usage chunk; Messages: ``message_stop``; Responses: the
terminal ``response.*`` event), which are held until the ledger row is durable (a chat usage chunk
is dropped when the client did not ask for usage). An event that makes ``guard.on_tokens`` answer
False is not forwarded: the upstream is closed at once and the client gets the protocol's error
event (and chat's ``[DONE]``); the ledger row counts the tokens delivered before it.

A client that hangs up mid-stream (``server.on_client_disconnect``):

* ``cancel`` (the default): the upstream connection is closed, so the engine stops generating
  (vLLM aborts the request). The ledger bills the prompt and every output token the gateway had
  read from the backend, delivered or not; the few tokens the engine computed after the gateway's
  last read reach no one and are not billed (nothing can see them: vLLM reports no usage for an
  aborted request). A client gone before the backend's first event is released unbilled.
* ``finish``: the gateway reads the backend's stream to its end without a client (hard caps and
  budgets still cut it), and bills the backend's own usage: the ledger equals the engines' counters
  to the token, for the price of computing answers nobody reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import orjson
from starlette.responses import StreamingResponse

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.adapter import HOLD, StreamReader, Usage, split_event
from tokenomy.gateway.http.flight import Completion, Flight, resolve_usage
from tokenomy.gateway.routing.upstream import UpstreamError, UpstreamResponseLike


def stream_response(completion: Completion, flight: Flight, resp: UpstreamResponseLike) -> StreamingResponse:
    headers = {"x-request-id": flight.req.request_id, "cache-control": "no-cache", **flight.admission.headers}
    return StreamingResponse(_relay(completion, flight, resp), media_type="text/event-stream", headers=headers)


class SseFramer:
    """Cuts a byte stream into SSE events (each ending in a blank line), line ends normalised to
    ``\n``. A ``\r\n`` may be split across two reads: a read ending in ``\r`` keeps it back
    until the next read shows whether a ``\n`` follows."""

    __slots__ = ("_buf", "_cr")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._cr = False

    def feed(self, raw: bytes) -> list[bytes]:
        """The events that ``raw`` completes, in order."""
        if self._cr:
            raw = b"\r" + raw
        self._cr = raw.endswith(b"\r")
        if self._cr:
            raw = raw[:-1]
        buf = self._buf
        buf += raw.replace(b"\r\n", b"\n") if b"\r" in raw else raw
        out: list[bytes] = []
        while True:
            i = buf.find(b"\n\n")
            if i < 0:
                return out
            out.append(bytes(buf[: i + 2]))
            del buf[: i + 2]


class _Read:
    """A stream's read state, kept outside the relay generator: a client that hangs up closes the
    generator mid-batch, and ``finish`` meters the rest of the backend's stream from here."""

    __slots__ = ("framer", "pending", "reader", "answered")

    def __init__(self, reader: StreamReader) -> None:
        self.framer = SseFramer()
        self.pending: deque[bytes] = deque()  # events framed but not yet handled
        self.reader = reader
        self.answered = False  # the backend sent a data event: the prompt was computed


async def _relay(completion: Completion, flight: Flight, resp: UpstreamResponseLike) -> AsyncIterator[bytes]:
    req = flight.req
    proto = req.protocol
    state = _Read(proto.reader(req.client_wants_usage))
    reader, pending = state.reader, state.pending
    held: list[bytes] = []  # events that tell the client the request is complete: after the ledger
    try:
        try:
            async for raw in resp.aiter_bytes():
                pending.extend(state.framer.feed(raw))
                while pending:
                    event = pending.popleft()
                    name, data = split_event(event)
                    if data is None:
                        yield event  # comments, keep-alives
                        continue
                    if data == b"[DONE]":
                        pending.clear()
                        break
                    state.answered = True
                    try:
                        obj = orjson.loads(data)
                    except ValueError:
                        yield event
                        continue
                    if not isinstance(obj, dict):
                        yield event
                        continue
                    n, out = reader.feed(name, obj, event)
                    if n:
                        now = time.perf_counter()
                        if flight.first_token_s is None:
                            flight.first_token_s = now
                            flight.backend.first_token(req.request_id)
                        flight.last_token_s = now
                        if not completion.guard.on_tokens(flight.admission, n):
                            await _uncancellable(completion, _cut(completion, flight, resp, state))
                            yield proto.error_event(_cut_error())
                            yield proto.terminator
                            return
                        flight.delivered_tokens += n
                    if out is HOLD:
                        held.append(event)
                    elif out is not None:
                        yield out
        except UpstreamError as exc:
            await _uncancellable(completion, _upstream_failed(completion, flight, resp, state, exc))
            yield proto.error_event(GatewayError(502, f"backend stream broke: {exc}", "server_error",
                                                 "upstream_error"))
            yield proto.terminator
            return
        await resp.aclose()
        usage = resolve_usage(reader.usage, req.prompt_tokens_estimate, flight.delivered_tokens)
        flight.backend.finished(req.request_id, req.stream_key, usage.total)
        try:
            await _uncancellable(completion, completion.finish(flight, usage, status=200, outcome="ok",
                                                               end_s=time.perf_counter(),
                                                               answer=getattr(reader, "final", None)))
        except GatewayError as err:
            yield proto.error_event(err)
            yield proto.terminator
            return
        for event in held:
            yield event
        yield proto.terminator
    finally:
        if not flight.ticket.done:  # the client went away (cancelled) before we finished
            completion.spawn(_abandoned(completion, flight, resp, state))


async def _uncancellable(completion: Completion, coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` (ledger write, settle) to the end even if the client leaves meanwhile: Starlette
    cancels a stream's task on disconnect, and a half-completion finish would leave a hold unsettled."""
    task = asyncio.get_running_loop().create_task(coro)
    completion.background.add(task)
    task.add_done_callback(completion.background.discard)
    await asyncio.shield(task)


def _cut_error() -> GatewayError:
    return GatewayError(
        429, "stream cut: a hard token cap or budget was crossed", "insufficient_quota", "stream_cut"
    )


async def _cut(completion: Completion, flight: Flight, resp: UpstreamResponseLike, state: _Read) -> None:
    await resp.aclose()
    req = flight.req
    flight.backend.finished(req.request_id, None, 0)
    await completion.finish(flight, _delivered(flight, state), status=200, outcome="cut", end_s=time.perf_counter())


async def _upstream_failed(completion: Completion, flight: Flight, resp: UpstreamResponseLike, state: _Read,
                           exc: Exception) -> None:
    await resp.aclose()
    req = flight.req
    flight.backend.finished(req.request_id, None, 0)
    completion.metrics.upstream_failures.labels(flight.backend.instance_id).inc()
    if flight.delivered_tokens:
        await completion.finish(flight, _delivered(flight, state), status=502, outcome="upstream_error",
                                end_s=time.perf_counter())
    else:
        await completion.release(flight.ticket, f"upstream {type(exc).__name__}")


async def _abandoned(completion: Completion, flight: Flight, resp: UpstreamResponseLike, state: _Read) -> None:
    """The client disconnected: stop the backend and meter what it was sent, or (``finish``) read
    the backend's answer to its end and meter all of it; release when the backend had not answered."""
    req = flight.req
    if completion.config.server.on_client_disconnect == "finish" and not flight.ticket.done:
        with contextlib.suppress(UpstreamError, asyncio.CancelledError):
            if await _read_to_end(completion, flight, resp, state):
                await resp.aclose()
                usage = resolve_usage(state.reader.usage, req.prompt_tokens_estimate, flight.delivered_tokens)
                flight.backend.finished(req.request_id, req.stream_key, usage.total)
                await completion.finish(flight, usage, status=499, outcome="disconnected", end_s=time.perf_counter())
                return
    with contextlib.suppress(UpstreamError, asyncio.CancelledError):
        await resp.aclose()
    flight.backend.finished(req.request_id, None, 0)
    if flight.ticket.done:
        return
    if flight.delivered_tokens or state.answered:
        await completion.finish(flight, _received(flight, state), status=499, outcome="disconnected",
                                end_s=time.perf_counter())
    else:
        await completion.release(flight.ticket, "client disconnected")


async def _read_to_end(completion: Completion, flight: Flight, resp: UpstreamResponseLike, state: _Read) -> bool:
    """Meter the rest of a stream whose client is gone: True when it ended, False when a hard cap
    or budget cut it (the caller closes the upstream and bills what was read)."""
    reader, pending = state.reader, state.pending

    def meter() -> bool | None:
        while pending:
            event = pending.popleft()
            name, data = split_event(event)
            if data is None:
                continue
            if data == b"[DONE]":
                return True
            state.answered = True
            try:
                obj = orjson.loads(data)
            except ValueError:
                continue
            if isinstance(obj, dict):
                n, _ = reader.feed(name, obj, event)
                if n:
                    if not completion.guard.on_tokens(flight.admission, n):
                        return False
                    flight.delivered_tokens += n
        return None

    done = meter()
    if done is not None:
        return done
    async for raw in resp.aiter_bytes():
        pending.extend(state.framer.feed(raw))
        done = meter()
        if done is not None:
            return done
    return True


def _delivered(flight: Flight, state: _Read) -> Usage:
    """A stream that ended early (a cap cut it, the backend broke it): :func:`_so_far` with the
    output tokens delivered."""
    return _so_far(flight, state, flight.delivered_tokens)


def _received(flight: Flight, state: _Read) -> Usage:
    """A stream its client left: :func:`_so_far` with every output token read from the backend."""
    reported = (state.reader.usage or Usage()).output or 0
    return _so_far(flight, state, max(reported, flight.delivered_tokens))


def _so_far(flight: Flight, state: _Read, output: int) -> Usage:
    """The prompt and its cached part as the backend reported them so far (Messages'
    ``message_start``, a chat stream's running usage), else the prompt estimate; ``output`` tokens."""
    u = state.reader.usage or Usage()
    return Usage(prompt=u.prompt if u.prompt is not None else flight.req.prompt_tokens_estimate,
                 output=output, cached=u.cached, reasoning=min(u.reasoning, output))
