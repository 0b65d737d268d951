"""``POST /v1/completions`` and ``/v1/chat/completions`` as plain ASGI handlers.

They bypass Starlette's routing and middleware: a streamed token costs one ``send`` and a
pre-formatted chunk, nothing more (every running stream writes once per modelled step). While a
request runs, a second task watches for the client's ``http.disconnect``; if it comes first the
request is aborted and its KV freed at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from tokenomy.emulator.driver import EngineStopped, RequestHandle
from tokenomy.emulator.job import Job
from tokenomy.emulator.protocol import APIError, ChatCompletionRequest, CompletionRequest, validation_error
from tokenomy.emulator.service import Emulator

log = logging.getLogger(__name__)

_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


async def send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _usage(job: Job, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": job.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": job.cached_tokens},
    }


class _Formatter:
    """JSON bodies of one request. Generated text never needs JSON escaping (palette words are
    ASCII letters after a space, see :mod:`tokenomy.emulator.tokenizer`), so chunks are built by
    concatenation."""

    def __init__(self, job: Job, model: str, chat: bool) -> None:
        self.job = job
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + job.request_id
        self.created = int(time.time())
        self.model = model
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = f'data: {{"id":"{self.id}","object":"{obj}","created":{self.created},"model":{json.dumps(model)},'
        self._head = head
        if chat:
            self._open = head + '"choices":[{"index":0,"delta":{"content":"'
            self._mid = '"},"logprobs":null,"finish_reason":null}]}\n\n'
            self._end = '"},"logprobs":null,"finish_reason":"%s"}]}\n\n'
        else:
            self._open = head + '"choices":[{"index":0,"text":"'
            self._mid = '","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self._end = '","logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'

    def first_chunk(self) -> bytes:
        return (self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]}\n\n').encode()

    def chunk(self, text: str, finish_reason: str | None) -> bytes:
        tail = self._mid if finish_reason is None else self._end % finish_reason
        return (self._open + text + tail).encode()

    def usage_chunk(self, completion_tokens: int) -> bytes:
        usage = json.dumps(_usage(self.job, completion_tokens), separators=(",", ":"))
        return (self._head + '"choices":[],"usage":' + usage + "}\n\n").encode()

    def whole(self, text: str, finish_reason: str, completion_tokens: int) -> dict[str, Any]:
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                      "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": None, "prompt_logprobs": None}
        return {
            "id": self.id, "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created, "model": self.model, "choices": [choice],
            "usage": _usage(self.job, completion_tokens), "kv_transfer_params": self.job.kv_transfer_params,
        }


async def read_body(receive: Receive, max_bytes: int) -> bytes:
    """The request body; APIError 413 past ``max_bytes`` (read no further)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise APIError(413, f"The request body is larger than {max_bytes} bytes.", type_="RequestTooLargeError")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _parse(raw: bytes, chat: bool) -> CompletionRequest | ChatCompletionRequest:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.")
    model = ChatCompletionRequest if chat else CompletionRequest
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            return str(value.decode("latin-1"))
    return ""


def generate_handler(get_emulator: Callable[[], Emulator], chat: bool
                     ) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI handler of one generate route."""

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        emu = get_emulator()
        arrival = asyncio.get_running_loop().time()
        try:
            body = _parse(await read_body(receive, emu.config.max_body_bytes), chat)
            job = emu.prepare(body)
            job.client_request_id = _request_id(scope)
        except APIError as err:
            await send_json(send, err.status, err.body())
            return
        except ConnectionResetError:
            return
        run = _Run(emu, job, body, _Formatter(job, emu.model_name, chat), arrival)
        work = asyncio.ensure_future(run.stream(send) if body.stream else run.whole(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            watch.cancel()
            run.abort()
            raise
        if work in done:
            watch.cancel()
            exc = work.exception()
            if exc is not None and not isinstance(exc, OSError):
                log.error("request %s failed", job.request_id, exc_info=exc)
                if not run.started:
                    await send_json(send, 500, APIError(500, f"internal error: {exc}").body())
        else:
            work.cancel()
            run.abort()
            with suppress(asyncio.CancelledError, OSError):
                await work

    return handle


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Run:
    """One request on the engine and its response."""

    def __init__(self, emu: Emulator, job: Job, body: CompletionRequest | ChatCompletionRequest,
                 fmt: _Formatter, arrival: float) -> None:
        self.emu = emu
        self.job = job
        self.body = body
        self.fmt = fmt
        self.arrival = arrival
        self.handle: RequestHandle | None = None
        self.started = False

    def abort(self) -> None:
        if self.handle is not None:
            self.emu.abort(self.handle)

    async def _start(self, send: Send) -> RequestHandle | None:
        try:
            self.handle = await self.emu.start_job(self.job, self.arrival)
        except APIError as err:
            self.started = True
            await send_json(send, err.status, err.body())
            return None
        return self.handle

    async def stream(self, send: Send) -> None:
        handle = await self._start(send)
        if handle is None:
            return
        fmt, pieces, reason = self.fmt, self.job.plan.pieces, self.job.plan.finish_reason
        self.started = True
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        if fmt.chat:
            await send({"type": "http.response.body", "body": fmt.first_chunk(), "more_body": True})
        sent = 0
        while True:
            try:
                await handle.wait()
            except EngineStopped as exc:  # as vLLM does: an error event, then the end of the stream
                # Tokens delivered by the last step before the crash still go out first.
                tokens = fmt.chunk("".join(pieces[sent:handle.emitted]), None) if handle.emitted > sent else b""
                err = json.dumps(APIError(503, str(exc)).body()).encode()
                await send({"type": "http.response.body",
                            "body": tokens + b"data: " + err + b"\n\ndata: [DONE]\n\n", "more_body": False})
                return
            n = handle.emitted
            done = handle.finished is not None
            if n > sent or done:
                body = fmt.chunk("".join(pieces[sent:n]), reason if done else None)
                await send({"type": "http.response.body", "body": body, "more_body": True})
                sent = n
            if done:
                break
        self.emu.finish_job(self.job, handle)
        tail = fmt.usage_chunk(sent) if self.body.include_usage else b""
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})

    async def whole(self, send: Send) -> None:
        handle = await self._start(send)
        if handle is None:
            return
        try:
            while handle.finished is None:
                await handle.wait()
        except EngineStopped as exc:
            self.started = True
            await send_json(send, 503, APIError(503, str(exc)).body())
            return
        self.emu.finish_job(self.job, handle)
        n = handle.emitted
        self.started = True
        await send_json(send, 200, self.fmt.whole("".join(self.job.plan.pieces[:n]), self.job.plan.finish_reason, n))
