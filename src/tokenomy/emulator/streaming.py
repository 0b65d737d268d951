"""Running a generate request as a plain ASGI handler (:func:`serve`): ``POST /v1/completions`` and
``/v1/chat/completions`` here, the agent protocols in :mod:`tokenomy.emulator.agents`; the bytes
of each answer come from :mod:`tokenomy.emulator.answers`.

They bypass Starlette's routing and middleware: a streamed token costs one ``send`` and a
pre-formatted chunk, nothing more (every running stream writes once per modelled step). While a
request runs, a second task watches for the client's ``http.disconnect``; if it comes first the
request is aborted and its KV freed at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from tokenomy.emulator.answers import Answer, ChatAnswer, ChatChunks, TextAnswer
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
        raise APIError(400, f"Invalid JSON body: {exc}", validation=True) from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", validation=True)
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


Build = Callable[[Emulator, bytes], tuple[Job, bool, Answer]]
"""Parse a raw body into (the job, whether to stream, its answer); raises APIError (its shape is
``on_error``'s)."""


async def serve(scope: Scope, receive: Receive, send: Send, emu: Emulator, build: Build,
                on_error: Callable[[APIError], dict[str, Any]]) -> None:
    """Run one request: parse and plan it, answer it (streamed or whole), abort it if the client leaves."""
    arrival = asyncio.get_running_loop().time()
    try:
        job, stream, answer = build(emu, await read_body(receive, emu.config.max_body_bytes))
        job.client_request_id = _request_id(scope)
    except APIError as err:
        await send_json(send, err.status, on_error(err))
        return
    except ConnectionResetError:
        return
    run = _Run(emu, job, answer, arrival)
    work = asyncio.ensure_future(run.stream(send) if stream else run.whole(send))
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
                await send_json(send, 500, on_error(APIError(500, f"internal error: {exc}")))
    else:
        work.cancel()
        run.abort()
        with suppress(asyncio.CancelledError, OSError):
            await work


def generate_handler(get_emulator: Callable[[], Emulator], chat: bool
                     ) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI handler of ``/v1/completions`` or ``/v1/chat/completions``."""

    def build(emu: Emulator, raw: bytes) -> tuple[Job, bool, Answer]:
        body = _parse(raw, chat)
        job = emu.prepare(body)
        answer: Answer
        if isinstance(body, ChatCompletionRequest) and (job.plan.tool_call or body.continuous_usage):
            chunks = ChatChunks(job, emu.model_name, named_tool=body.named_tool_choice,
                                continuous_usage=body.continuous_usage)
            answer = ChatAnswer(chunks, body.include_usage)
        else:
            answer = TextAnswer(job, emu.model_name, chat, body.include_usage)
        return job, body.stream, answer

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        await serve(scope, receive, send, get_emulator(), build, APIError.body)

    return handle


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Run:
    """One request on the engine and its response."""

    def __init__(self, emu: Emulator, job: Job, answer: Answer, arrival: float) -> None:
        self.emu = emu
        self.job = job
        self.answer = answer
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
            await send_json(send, err.status, self.answer.error_body(err))
            return None
        return self.handle

    async def stream(self, send: Send) -> None:
        handle = await self._start(send)
        if handle is None:
            return
        answer = self.answer
        self.started = True
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        head = answer.open()
        if head:
            await send({"type": "http.response.body", "body": head, "more_body": True})
        sent = 0
        while True:
            try:
                await handle.wait()
            except EngineStopped as exc:  # as vLLM does: an error event, then the end of the stream
                # Tokens delivered by the last step before the crash still go out first.
                body = answer.crashed(sent, handle.emitted, str(exc))
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            n = handle.emitted
            done = handle.finished is not None
            if n > sent or done:
                await send({"type": "http.response.body", "body": answer.step(sent, n, done), "more_body": True})
                sent = n
            if done:
                break
        self.emu.finish_job(self.job, handle)
        await send({"type": "http.response.body", "body": answer.close(sent), "more_body": False})

    async def whole(self, send: Send) -> None:
        handle = await self._start(send)
        if handle is None:
            return
        try:
            while handle.finished is None:
                await handle.wait()
        except EngineStopped as exc:
            self.started = True
            await send_json(send, 503, self.answer.error_body(APIError(503, str(exc))))
            return
        self.emu.finish_job(self.job, handle)
        self.started = True
        await send_json(send, 200, self.answer.whole(handle.emitted))
