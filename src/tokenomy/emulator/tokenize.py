"""``POST /tokenize`` and ``POST /detokenize`` with vLLM's request and response shapes
(``vllm/entrypoints/serve/tokenize/protocol.py``), so a client sizes prompts for the emulator
exactly as for vLLM (``tokenomy bench --tokenizer auto``).

``/tokenize`` takes ``{"prompt": str}`` (a completions prompt) or ``{"messages": [...]}``
(rendered by the emulator's chat template, with the generation prompt unless
``add_generation_prompt`` is false) and answers ``{"count", "max_model_len", "tokens",
"token_strs"}``; the ids are those a completion request of the same input would count.
``/detokenize`` takes ``{"tokens": [...]}`` and answers ``{"prompt": str}``; the built-in
tokenizer hashes words to ids, so only ids the emulator generates decode (others are a 400).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tokenomy.emulator.chat import render
from tokenomy.emulator.protocol import APIError, ChatMessage, validation_error
from tokenomy.emulator.service import Emulator


class _TokenizeBase(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeCompletionRequest(_TokenizeBase):
    prompt: str


class TokenizeChatRequest(_TokenizeBase):
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int] = Field(default_factory=list)


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.")
    return data


def _check_model(emu: Emulator, model: str | None) -> None:
    if model is not None and model != emu.model_name:
        raise APIError(404, f"The model `{model}` does not exist.", param="model", type_="NotFoundError")


def _tokenize(emu: Emulator, data: dict[str, Any]) -> dict[str, Any]:
    req: TokenizeCompletionRequest | TokenizeChatRequest
    try:
        if "messages" in data:
            req = TokenizeChatRequest.model_validate(data)
        else:
            req = TokenizeCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    _check_model(emu, req.model)
    if isinstance(req, TokenizeChatRequest):
        ids = emu.tokenizer.encode(render(req.messages, req.add_generation_prompt))
    else:
        ids = emu.tokenizer.encode(req.prompt)
    strs = None
    if req.return_token_strs:
        strs = [_piece_or_none(emu, i) for i in ids]
    return {"count": len(ids), "max_model_len": emu.context_window, "tokens": ids, "token_strs": strs}


def _piece_or_none(emu: Emulator, token_id: int) -> str | None:
    try:
        return emu.tokenizer.piece(token_id)
    except ValueError:
        return None


def _detokenize(emu: Emulator, data: dict[str, Any]) -> dict[str, Any]:
    try:
        req = DetokenizeRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    _check_model(emu, req.model)
    try:
        return {"prompt": "".join(emu.tokenizer.piece(t) for t in req.tokens)}
    except ValueError as exc:
        raise APIError(400, f"{exc}: the emulator decodes only the ids it generates", param="tokens") from None


def tokenize_routes(get_emulator: Callable[[], Emulator]) -> list[Route]:
    """The two routes, bound to the instance ``get_emulator`` returns."""

    def endpoint(fn: Callable[[Emulator, dict[str, Any]], dict[str, Any]]) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            try:
                return JSONResponse(fn(get_emulator(), await _json_object(request)))
            except APIError as err:
                return JSONResponse(err.body(), status_code=err.status)

        return handle

    return [Route("/tokenize", endpoint(_tokenize), methods=["POST"]),
            Route("/detokenize", endpoint(_detokenize), methods=["POST"])]
