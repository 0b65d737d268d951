"""The translated path: a Messages or Responses request for a backend that serves only chat.

The request is translated to chat completions at parse time (:func:`translate`); the backend's
answer, whole or streamed, is translated back into the client's protocol before the chain reads it,
so metering, holds and errors work on the client's protocol exactly as on the native path. The
translations are :mod:`tokenomy.protocols` (pure functions, shared with the emulator, which serves
both protocols the way vLLM does: by translating them to chat).

A chat stream is asked for ``continuous_usage_stats`` so that the translated stream's
``message_start`` carries the real prompt size (its usage is never all zeros); without it the
gateway's estimate stands in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from tokenomy.gateway.errors import GatewayError
from tokenomy.gateway.http.adapter import split_event, sse
from tokenomy.gateway.http.parse import ParsedRequest
from tokenomy.gateway.http.streaming import SseFramer
from tokenomy.gateway.routing.upstream import UpstreamResponseLike
from tokenomy.protocols.common import ProtocolError
from tokenomy.protocols.messages import chat_to_messages, messages_to_chat
from tokenomy.protocols.messages_stream import ChatToMessagesStream
from tokenomy.protocols.responses import chat_to_responses, responses_to_chat
from tokenomy.protocols.responses_stream import ChatToResponsesStream


def translate(req: ParsedRequest) -> None:
    """Turn ``req`` (Messages or Responses) into a chat request; its answer comes back translated."""
    client_body = req.body
    try:
        if req.protocol.name == "messages":
            chat = messages_to_chat(client_body)
            translator: Translator = MessagesTranslator(client_body, req.model, req.prompt_tokens_estimate)
        else:
            chat = responses_to_chat(client_body)
            translator = ResponsesTranslator(client_body, req.model, req.prompt_tokens_estimate)
    except ProtocolError as exc:
        raise GatewayError(exc.status, exc.message, "invalid_request_error", "invalid_value", exc.param) from None
    chat["model"] = req.model
    chat.pop("stream_options", None)
    if req.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    req.body = chat
    req.endpoint = "chat"
    req.translator = translator
    req.upstream_headers = {}


class Translator:
    """Turns a chat backend's answer into the client's protocol."""

    def __init__(self, client_body: dict[str, Any], model: str, prompt_estimate: int) -> None:
        self.client_body = client_body
        self.model = model
        self.prompt_estimate = prompt_estimate

    def whole(self, chat: Any) -> Any:
        raise NotImplementedError

    def converter(self) -> Any:
        """A per-stream object with ``feed(chunk) -> [(event, data)]`` and ``finish() -> [...]``."""
        raise NotImplementedError

    def stream(self, resp: UpstreamResponseLike) -> UpstreamResponseLike:
        return TranslatedStream(resp, self.converter())


class MessagesTranslator(Translator):
    def whole(self, chat: Any) -> Any:
        return chat_to_messages(chat, self.model) if isinstance(chat, dict) else chat

    def converter(self) -> Any:
        return ChatToMessagesStream(self.model, input_tokens_estimate=self.prompt_estimate)


class ResponsesTranslator(Translator):
    def whole(self, chat: Any) -> Any:
        return chat_to_responses(chat, self.client_body) if isinstance(chat, dict) else chat

    def converter(self) -> Any:
        return ChatToResponsesStream(self.client_body, input_tokens_estimate=self.prompt_estimate)


class TranslatedStream:
    """An upstream chat stream read as the client's protocol's stream (the relay cannot tell)."""

    def __init__(self, resp: UpstreamResponseLike, converter: Any) -> None:
        self._resp = resp
        self._conv = converter
        self.content = b""

    @property
    def status_code(self) -> int:
        return self._resp.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def read(self) -> bytes:
        return await self._resp.read()

    async def aclose(self) -> None:
        await self._resp.aclose()

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        framer = SseFramer()
        conv = self._conv
        async for raw in self._resp.aiter_bytes():
            out: list[bytes] = []
            for event in framer.feed(raw):
                _, data = split_event(event)
                if data is None:
                    continue
                if data == b"[DONE]":
                    out += [sse(n, d) for n, d in conv.finish()]
                    yield b"".join(out)
                    return
                try:
                    chunk = orjson.loads(data)
                except ValueError:
                    continue
                if isinstance(chunk, dict):
                    out += [sse(n, d) for n, d in conv.feed(chunk)]
            if out:
                yield b"".join(out)
        tail = [sse(n, d) for n, d in conv.finish()]
        if tail:
            yield b"".join(tail)
