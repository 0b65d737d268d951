"""``POST /v1/messages``, ``/v1/messages/count_tokens`` (Anthropic) and ``/v1/responses`` (OpenAI), as
vLLM 0.32 serves them: the request becomes a chat request (:mod:`tokenomy.protocols`), runs as one,
and its chat answer, whole or chunk by chunk (with usage in every chunk, as vLLM asks its own chat
layer for), is rendered back in the protocol's shape. So a Messages or Responses request has the
prompt, the answer and the prefix-cache hits of the chat request it translates to.

Errors, as vLLM answers them: a body that fails validation (bad JSON, a missing or mistyped field)
gets OpenAI's ``{"error": {...}}`` with status 400 on every route; on ``/v1/messages`` an error
found later (unknown model 404, a prompt over the context) is Anthropic's
``{"type": "error", "error": {"type", "message"}}`` with vLLM's type names (``NotFoundError``...).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from tokenomy.emulator.answers import ChatChunks
from tokenomy.emulator.chat import render
from tokenomy.emulator.job import Job
from tokenomy.emulator.protocol import APIError, ChatCompletionRequest
from tokenomy.emulator.service import Emulator
from tokenomy.emulator.streaming import Build, serve
from tokenomy.protocols import ProtocolError
from tokenomy.protocols.messages import (
    ChatToMessagesStream,
    chat_to_messages,
    count_tokens_chat,
    messages_to_chat,
)
from tokenomy.protocols.responses import chat_to_responses, responses_to_chat
from tokenomy.protocols.responses_stream import ChatToResponsesStream
from tokenomy.protocols.sse import anthropic_error_body, format_events, responses_error_event

JSON = dict[str, Any]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]


def _object(raw: bytes) -> JSON:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"Invalid JSON body: {exc}", validation=True) from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", validation=True)
    return data


def _translate(fn: Callable[[JSON], JSON], data: JSON) -> JSON:
    try:
        return fn(data)
    except ProtocolError as exc:
        raise APIError(exc.status, exc.message, param=exc.param, validation=exc.status == 400,
                       type_="BadRequestError" if exc.status == 400 else "invalid_request_error") from None


def _chat_request(chat: JSON) -> ChatCompletionRequest:
    """The translated request as the chat endpoint validates it (a failure here is vLLM's handler's)."""
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise APIError(400, f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")), param=loc or None) from None


def _need_model(data: JSON) -> None:
    if not isinstance(data.get("model"), str) or not data["model"]:
        raise APIError(400, "model: Field required", param="model", validation=True)


def anthropic_error(err: APIError) -> JSON:
    """vLLM's ``/v1/messages`` error: OpenAI's shape for validation, Anthropic's after that."""
    return err.body() if err.validation else anthropic_error_body(err.status, err.message, err.type)


# ---- Anthropic Messages --------------------------------------------------------------------
class MessagesAnswer:
    """A chat answer (:class:`ChatChunks`) as an Anthropic Messages answer."""

    def __init__(self, chunks: ChatChunks, model: str) -> None:
        self.chunks = chunks
        self.model = model
        self.stream = ChatToMessagesStream(model, input_tokens_estimate=chunks.job.prompt_tokens)

    def open(self) -> bytes:
        return format_events(self.stream.feed(self.chunks.first()))

    def step(self, sent: int, n: int, done: bool) -> bytes:
        return format_events(self.stream.feed(self.chunks.piece(sent, n, done)))

    def close(self, n: int) -> bytes:
        return format_events(self.stream.feed(self.chunks.usage(n)) + self.stream.finish())

    def crashed(self, sent: int, n: int, message: str) -> bytes:
        tokens = self.step(sent, n, False) if n > sent else b""  # vLLM: an error event, type internal_error
        return tokens + format_events([("error", anthropic_error_body(500, message, "internal_error"))])

    def whole(self, n: int) -> JSON:
        out = chat_to_messages(self.chunks.whole(n), self.model)
        if self.chunks.job.kv_transfer_params is not None:
            out["kv_transfer_params"] = self.chunks.job.kv_transfer_params
        return out

    def error_body(self, err: APIError) -> JSON:
        return anthropic_error(err)


def _build_messages(emu: Emulator, raw: bytes) -> tuple[Job, bool, MessagesAnswer]:
    data = _object(raw)
    _need_model(data)
    body = _chat_request(_translate(messages_to_chat, data))
    job = emu.prepare(body)
    chunks = ChatChunks(job, emu.model_name, named_tool=body.named_tool_choice, continuous_usage=True)
    return job, body.stream, MessagesAnswer(chunks, emu.model_name)


async def count_tokens(emu: Emulator, request: Request) -> Response:
    """``/v1/messages/count_tokens``: the prompt the same ``/v1/messages`` request would have."""
    try:
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > emu.config.max_body_bytes:
                raise APIError(413, f"The request body is larger than {emu.config.max_body_bytes} bytes.",
                               type_="RequestTooLargeError")
        data = _object(bytes(raw))
        _need_model(data)
        chat = _translate(count_tokens_chat, data)
        if chat.get("model") != emu.model_name:
            raise APIError(404, f"The model `{chat.get('model')}` does not exist.", param="model",
                           type_="NotFoundError")
        body = _chat_request(chat)
    except APIError as err:
        return JSONResponse(anthropic_error(err), status_code=err.status)
    n = len(emu.tokenizer.encode(render(body.messages, body.add_generation_prompt)))
    return JSONResponse({"input_tokens": n, "context_management": {"original_input_tokens": n}})


# ---- OpenAI Responses ----------------------------------------------------------------------
class ResponsesAnswer:
    """A chat answer (:class:`ChatChunks`) as a Responses answer to ``request``."""

    def __init__(self, chunks: ChatChunks, request: JSON) -> None:
        self.chunks = chunks
        self.request = {**request, "model": request.get("model") or chunks.model}
        self.stream = ChatToResponsesStream(self.request, input_tokens_estimate=chunks.job.prompt_tokens)

    def open(self) -> bytes:
        return format_events(self.stream.feed(self.chunks.first()))

    def step(self, sent: int, n: int, done: bool) -> bytes:
        return format_events(self.stream.feed(self.chunks.piece(sent, n, done)))

    def close(self, n: int) -> bytes:
        return format_events(self.stream.feed(self.chunks.usage(n)) + self.stream.finish())

    def crashed(self, sent: int, n: int, message: str) -> bytes:
        tokens = self.step(sent, n, False) if n > sent else b""
        return tokens + responses_error_event(503, message, self.stream.sequence_number)

    def whole(self, n: int) -> JSON:
        return chat_to_responses(self.chunks.whole(n), self.request)

    def error_body(self, err: APIError) -> JSON:
        return err.body()


def _build_responses(emu: Emulator, raw: bytes) -> tuple[Job, bool, ResponsesAnswer]:
    data = _object(raw)
    body = _chat_request(_translate(responses_to_chat, data))
    try:
        job = emu.prepare(body)
    except APIError as err:
        if err.param == "input_tokens":  # vLLM's Responses words the context check its own way
            raise APIError(400, f"The engine prompt length {len(emu.tokenizer.encode(render(body.messages)))} "
                                f"exceeds the max_model_len {emu.context_window}. Please reduce prompt.",
                           param="input", type_="invalid_request_error") from None
        raise
    chunks = ChatChunks(job, emu.model_name, named_tool=body.named_tool_choice, continuous_usage=True)
    return job, body.stream, ResponsesAnswer(chunks, data)


def agent_handlers(get_emulator: Callable[[], Emulator]) -> dict[str, Handler]:
    """Path -> ASGI handler of the two generate routes (``count_tokens`` is a plain route)."""

    def route(build: Build, on_error: Callable[[APIError], JSON]) -> Handler:
        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            await serve(scope, receive, send, get_emulator(), build, on_error)
        return handle

    return {"/v1/messages": route(_build_messages, anthropic_error),
            "/v1/responses": route(_build_responses, APIError.body)}
