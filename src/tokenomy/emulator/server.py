"""The OpenAI-compatible HTTP server around one :class:`Emulator` (Starlette on uvicorn).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics``, ``GET /tokenomy/info`` and ``POST /tokenomy/kv_release``
(PD: a decode instance says it pulled a request's KV). A client that disconnects, during a
stream or while waiting for a whole answer, aborts its request: its KV is freed at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tokenomy.emulator.config import EmulatorConfig
from tokenomy.emulator.driver import RequestHandle
from tokenomy.emulator.metrics import CONTENT_TYPE
from tokenomy.emulator.protocol import APIError, ChatCompletionRequest, CompletionRequest, validation_error
from tokenomy.emulator.service import KV_RELEASE_PATH, Emulator, Job


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


class _EngineResponse(Response):
    """Runs a request on the engine while watching for the client's disconnect.

    ``produce(send)`` writes the whole HTTP response; if the client disconnects first it is
    cancelled and ``on_disconnect`` runs (it aborts the request).
    """

    def __init__(self, produce: Callable[[Send], Awaitable[None]], on_disconnect: Callable[[], None]) -> None:
        self._produce = produce
        self._on_disconnect = on_disconnect
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def listen() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return

        work = asyncio.ensure_future(self._produce(send))
        watch = asyncio.ensure_future(listen())
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            watch.cancel()
            self._on_disconnect()
            raise
        if work in done:
            watch.cancel()
            work.result()
        else:
            work.cancel()
            self._on_disconnect()
            with suppress(asyncio.CancelledError, OSError):
                await work


def _usage(job: Job, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": job.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": job.cached_tokens},
    }


class _Formatter:
    """JSON bodies of one request (completions or chat), chunks pre-formatted for speed."""

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
            self._open = head + '"choices":[{"index":0,"delta":{"content":'
            self._close = '},"logprobs":null,"finish_reason":%s}]}\n\n'
        else:
            self._open = head + '"choices":[{"index":0,"text":'
            self._close = ',"logprobs":null,"finish_reason":%s,"stop_reason":null}]}\n\n'

    def first_chunk(self) -> bytes:
        return (self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]}\n\n').encode()

    def chunk(self, text: str, finish_reason: str | None) -> bytes:
        reason = "null" if finish_reason is None else f'"{finish_reason}"'
        return (self._open + json.dumps(text) + self._close % reason).encode()

    def usage_chunk(self, completion_tokens: int) -> bytes:
        return (self._head + '"choices":[],"usage":' + json.dumps(_usage(self.job, completion_tokens))
                + "}\n\n").encode()

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


_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


def build_app(config: EmulatorConfig) -> Starlette:
    """The ASGI app of one instance; the engine starts with the app's lifespan."""
    state: dict[str, Emulator] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        emu = Emulator(config)
        emu.start()
        state["emu"] = emu
        app.state.emulator = emu
        try:
            yield
        finally:
            await emu.stop()

    async def parse(request: Request, model: type[CompletionRequest] | type[ChatCompletionRequest]
                    ) -> CompletionRequest | ChatCompletionRequest:
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"Invalid JSON body: {exc}") from None
        if not isinstance(data, dict):
            raise APIError(400, "The request body must be a JSON object.")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc) from None

    async def generate(request: Request, chat: bool) -> Response:
        emu = state["emu"]
        arrival = asyncio.get_running_loop().time()
        try:
            body = await parse(request, ChatCompletionRequest if chat else CompletionRequest)
            job = emu.prepare(body)
        except APIError as err:
            return error_response(err)
        fmt = _Formatter(job, emu.model_name, chat)
        handle_box: list[RequestHandle] = []

        def on_disconnect() -> None:
            if handle_box:
                emu.abort(handle_box[0])

        async def start(send: Send) -> RequestHandle | None:
            try:
                handle = await emu.start_job(job, arrival)
            except APIError as err:
                resp = error_response(err)
                await send({"type": "http.response.start", "status": resp.status_code,
                            "headers": resp.raw_headers})
                await send({"type": "http.response.body", "body": resp.body})
                return None
            handle_box.append(handle)
            return handle

        pieces = job.plan.pieces
        reason = job.plan.finish_reason

        async def stream(send: Send) -> None:
            handle = await start(send)
            if handle is None:
                return
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            if chat:
                await send({"type": "http.response.body", "body": fmt.first_chunk(), "more_body": True})
            sent = 0
            while True:
                await handle.wait()
                n = handle.emitted
                done = handle.finished is not None
                if n > sent or done:
                    text = "".join(pieces[sent:n])
                    await send({"type": "http.response.body", "body": fmt.chunk(text, reason if done else None),
                                "more_body": True})
                    sent = n
                if done:
                    break
            emu.finish_job(job, handle)
            tail = fmt.usage_chunk(sent) if body.include_usage else b""
            await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})

        async def whole(send: Send) -> None:
            handle = await start(send)
            if handle is None:
                return
            while handle.finished is None:
                await handle.wait()
            emu.finish_job(job, handle)
            n = handle.emitted
            resp = JSONResponse(fmt.whole("".join(pieces[:n]), reason, n))
            await send({"type": "http.response.start", "status": 200, "headers": resp.raw_headers})
            await send({"type": "http.response.body", "body": resp.body})

        return _EngineResponse(stream if body.stream else whole, on_disconnect)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def models(request: Request) -> Response:
        emu = state["emu"]
        return JSONResponse({"object": "list", "data": [{
            "id": emu.model_name, "object": "model", "created": 0, "owned_by": "tokenomy",
            "root": emu.config.model, "max_model_len": emu.context_window,
        }]})

    async def health(request: Request) -> Response:
        return Response(status_code=200 if state["emu"].healthy else 503)

    async def metrics(request: Request) -> Response:
        return Response(state["emu"].metrics.render(), media_type=CONTENT_TYPE)

    async def info(request: Request) -> Response:
        emu = state["emu"]
        cfg = emu.config
        return JSONResponse({
            "instance_id": cfg.instance_id, "role": str(cfg.role), "model": cfg.model, "gpu": cfg.gpu,
            "tp": cfg.tp, "served_model_name": emu.model_name, "max_model_len": emu.context_window,
            "block_size": emu.engine_config.block_size_tokens, "num_gpu_blocks": emu.engine_config.num_gpu_blocks,
            "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "tokenizer": emu.tokenizer.name, "time_scale": cfg.time_scale,
            "lag_dropped_s": emu.driver.lag_dropped_s, "steps": emu.driver.steps,
        })

    async def kv_release(request: Request) -> Response:
        try:
            data = json.loads(await request.body())
            rid = data["remote_request_id"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            return error_response(APIError(400, "expected a JSON object with remote_request_id",
                                           param="remote_request_id"))
        released = state["emu"].release(str(rid))
        return JSONResponse({"released": released})

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(APIError(404, f"Not found: {request.url.path}"))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(APIError(405, f"Method {request.method} not allowed on {request.url.path}",
                                       type_="MethodNotAllowed"))

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenomy/info", info, methods=["GET"]),
        Route(KV_RELEASE_PATH, kv_release, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_allowed})
