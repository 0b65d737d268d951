"""Server-sent-event pass-through with metering, hard caps and disconnect handling.

Each upstream event is forwarded as the same bytes, except the final usage chunk, which is held
until the ledger row is durable and dropped when the client did not ask for usage. A chunk that
makes ``guard.on_tokens`` answer False is not forwarded: the upstream is closed at once and the
client gets an error event and ``[DONE]``; the ledger row counts the tokens delivered before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import orjson
from starlette.responses import StreamingResponse

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.flight import Completion, Flight
from tokenomy.gateway.metering.meter import usage_numbers
from tokenomy.gateway.routing.upstream import UpstreamError, UpstreamResponseLike

DONE = b"data: [DONE]\n\n"


def stream_response(completion: Completion, flight: Flight, resp: UpstreamResponseLike) -> StreamingResponse:
    headers = {"x-request-id": flight.req.request_id, "cache-control": "no-cache", **flight.admission.headers}
    return StreamingResponse(_relay(completion, flight, resp), media_type="text/event-stream", headers=headers)


def _error_event(err: GatewayError) -> bytes:
    return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


def _choice_tokens(c: Any) -> int:
    """Output tokens one streamed choice carries: its token ids or logprobs when the backend sent
    them (vLLM: ``return_token_ids``, ``logprobs``), else an estimate from its text (~4 characters
    a token, at least 1 when it carries anything): a backend may put several tokens in a chunk
    (speculative decoding, ``stream_interval``), so "one chunk, one token" undercounts."""
    if not isinstance(c, dict):
        return 0
    ids = c.get("token_ids")
    if isinstance(ids, list) and ids:
        return len(ids)
    lp = c.get("logprobs")
    if isinstance(lp, dict):
        seq = lp.get("content") if "content" in lp else lp.get("tokens")  # chat | completions
        if isinstance(seq, list) and seq:
            return len(seq)
    delta = c.get("delta")
    if isinstance(delta, dict):
        chars = 0
        for k in ("content", "reasoning_content", "reasoning"):
            v = delta.get(k)
            if isinstance(v, str):
                chars += len(v)
        calls = delta.get("tool_calls")
        if calls:
            chars += max(1, len(orjson.dumps(calls)) // 2)  # the JSON around the arguments is not output
        text = chars
    else:
        t = c.get("text")
        text = len(t) if isinstance(t, str) else 0
    return max(1, text // 4) if text else 0


def _count(obj: dict[str, Any], choices: Any, seen: int) -> tuple[int, int]:
    """(new output tokens in this chunk, output tokens seen so far). A chunk with cumulative
    ``usage`` (vLLM's ``continuous_usage_stats``) is exact: the growth of its completion_tokens."""
    usage = obj.get("usage")
    if isinstance(usage, dict):
        total = usage.get("completion_tokens")
        if isinstance(total, int) and not isinstance(total, bool) and total >= seen:
            return total - seen, total
    n = sum(_choice_tokens(c) for c in choices) if isinstance(choices, list) else 0
    return n, seen + n


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


async def _relay(completion: Completion, flight: Flight, resp: UpstreamResponseLike) -> AsyncIterator[bytes]:
    req = flight.req
    usage: Any = None
    usage_event: bytes | None = None
    framer = SseFramer()
    seen = 0  # output tokens counted so far
    try:
        try:
            async for raw in resp.aiter_bytes():
                for event in framer.feed(raw):
                    if not event.startswith(b"data:"):
                        yield event  # comments, keep-alives
                        continue
                    data = event[5:].strip()
                    if data == b"[DONE]":
                        break
                    try:
                        obj = orjson.loads(data)
                    except ValueError:
                        yield event
                        continue
                    if not isinstance(obj, dict):
                        yield event
                        continue
                    if obj.get("usage"):
                        usage = obj["usage"]
                    choices = obj.get("choices")
                    if not choices:
                        if obj.get("usage"):
                            usage_event = event  # held until the ledger row is durable
                        else:
                            yield event
                        continue
                    n, seen = _count(obj, choices, seen)
                    if obj.get("usage") and not req.client_wants_usage:
                        obj["usage"] = None
                        event = b"data: " + orjson.dumps(obj) + b"\n\n"
                    if n:
                        now = time.perf_counter()
                        if flight.first_token_s is None:
                            flight.first_token_s = now
                            flight.backend.first_token(req.request_id)
                        flight.last_token_s = now
                        if not completion.guard.on_tokens(flight.admission, n):
                            await _uncancellable(completion, _cut(completion, flight, resp))
                            yield _error_event(_cut_error())
                            yield DONE
                            return
                        flight.delivered_tokens += n
                    yield event
        except UpstreamError as exc:
            await _uncancellable(completion, _upstream_failed(completion, flight, resp, exc))
            yield _error_event(GatewayError(502, f"backend stream broke: {exc}", "server_error",
                                            "upstream_error"))
            yield DONE
            return
        await resp.aclose()
        prompt, out, cached = usage_numbers(usage, req.prompt_tokens_estimate, flight.delivered_tokens)
        flight.backend.finished(req.request_id, req.stream_key, prompt + out)
        try:
            await _uncancellable(completion, completion.finish(flight, prompt, out, cached, status=200, outcome="ok",
                                                     end_s=time.perf_counter()))
        except GatewayError as err:
            yield _error_event(err)
            yield DONE
            return
        if req.client_wants_usage and usage_event is not None:
            yield usage_event
        yield DONE
    finally:
        if not flight.ticket.done:  # the client went away (cancelled) before we finished
            completion.spawn(_abandoned(completion, flight, resp))


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


async def _cut(completion: Completion, flight: Flight, resp: UpstreamResponseLike) -> None:
    await resp.aclose()
    req = flight.req
    flight.backend.finished(req.request_id, None, 0)
    await completion.finish(
        flight, req.prompt_tokens_estimate, flight.delivered_tokens, 0, status=200, outcome="cut",
        end_s=time.perf_counter(),
    )


async def _upstream_failed(completion: Completion, flight: Flight, resp: UpstreamResponseLike, exc: Exception) -> None:
    await resp.aclose()
    req = flight.req
    flight.backend.finished(req.request_id, None, 0)
    completion.metrics.upstream_failures.labels(flight.backend.instance_id).inc()
    if flight.delivered_tokens:
        await completion.finish(flight, req.prompt_tokens_estimate, flight.delivered_tokens, 0, status=502,
                           outcome="upstream_error", end_s=time.perf_counter())
    else:
        await completion.release(flight.ticket, f"upstream {type(exc).__name__}")


async def _abandoned(completion: Completion, flight: Flight, resp: UpstreamResponseLike) -> None:
    """The client disconnected: stop the backend, meter what it was sent, or release."""
    with contextlib.suppress(UpstreamError, asyncio.CancelledError):
        await resp.aclose()
    req = flight.req
    flight.backend.finished(req.request_id, None, 0)
    if flight.ticket.done:
        return
    if flight.delivered_tokens:
        await completion.finish(flight, req.prompt_tokens_estimate, flight.delivered_tokens, 0, status=499,
                           outcome="disconnected", end_s=time.perf_counter())
    else:
        await completion.release(flight.ticket, "client disconnected")
