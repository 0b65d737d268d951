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
from tokenomy.gateway.routing.upstream import UpstreamError, UpstreamResponse

DONE = b"data: [DONE]\n\n"


def stream_response(completion: Completion, flight: Flight, resp: UpstreamResponse) -> StreamingResponse:
    headers = {"x-request-id": flight.req.request_id, "cache-control": "no-cache", **flight.admission.headers}
    return StreamingResponse(_relay(completion, flight, resp), media_type="text/event-stream", headers=headers)


def _error_event(err: GatewayError) -> bytes:
    return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


def _count(choices: Any) -> int:
    """Output tokens in one chunk: one per choice that carries text (vLLM streams a token a chunk)."""
    n = 0
    for c in choices:
        if not isinstance(c, dict):
            continue
        delta = c.get("delta")
        text = delta.get("content") or delta.get("tool_calls") if isinstance(delta, dict) else c.get("text")
        if text:
            n += 1
    return n


def _events(buf: bytearray) -> list[bytes]:
    """Complete SSE events taken off the front of ``buf`` (each ending in a blank line)."""
    out: list[bytes] = []
    while True:
        i = buf.find(b"\n\n")
        if i < 0:
            return out
        out.append(bytes(buf[: i + 2]))
        del buf[: i + 2]


async def _relay(completion: Completion, flight: Flight, resp: UpstreamResponse) -> AsyncIterator[bytes]:
    req = flight.req
    usage: Any = None
    usage_event: bytes | None = None
    buf = bytearray()
    try:
        try:
            async for raw in resp.aiter_bytes():
                buf += raw.replace(b"\r\n", b"\n")
                for event in _events(buf):
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
                    if obj.get("usage") and not req.client_wants_usage:
                        obj["usage"] = None
                        event = b"data: " + orjson.dumps(obj) + b"\n\n"
                    n = _count(choices)
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


async def _cut(completion: Completion, flight: Flight, resp: UpstreamResponse) -> None:
    await resp.aclose()
    req = flight.req
    flight.backend.finished(req.request_id, None, 0)
    await completion.finish(
        flight, req.prompt_tokens_estimate, flight.delivered_tokens, 0, status=200, outcome="cut",
        end_s=time.perf_counter(),
    )


async def _upstream_failed(completion: Completion, flight: Flight, resp: UpstreamResponse, exc: Exception) -> None:
    await resp.aclose()
    req = flight.req
    flight.backend.finished(req.request_id, None, 0)
    completion.metrics.upstream_failures.labels(flight.backend.instance_id).inc()
    if flight.delivered_tokens:
        await completion.finish(flight, req.prompt_tokens_estimate, flight.delivered_tokens, 0, status=502,
                           outcome="upstream_error", end_s=time.perf_counter())
    else:
        await completion.release(flight.ticket, f"upstream {type(exc).__name__}")


async def _abandoned(completion: Completion, flight: Flight, resp: UpstreamResponse) -> None:
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
