"""The OpenAI-compatible HTTP server around one :class:`Emulator` (Starlette on uvicorn).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/messages`` and
``POST /v1/messages/count_tokens`` (Anthropic), ``POST /v1/responses`` (OpenAI Responses, see
:mod:`tokenomy.emulator.agents`), ``GET /v1/models``,
``GET /health``, ``GET /metrics``, ``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes),
``GET /tokenomy/info`` and ``POST /tokenomy/kv_release``
(PD: a decode instance says it pulled a request's KV), and ``POST /v1/tokenomy/retain`` (a
gateway's KV retention hint, see ``RETAIN_PATH``). A client that disconnects, during a
stream or while waiting for a whole answer, aborts its request: its KV is freed at once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenomy.emulator.agents import agent_handlers, count_tokens
from tokenomy.emulator.config import EmulatorConfig
from tokenomy.emulator.metrics import CONTENT_TYPE
from tokenomy.emulator.pd import KV_RELEASE_PATH
from tokenomy.emulator.pins import RETAIN_PATH
from tokenomy.emulator.protocol import APIError
from tokenomy.emulator.service import Emulator
from tokenomy.emulator.streaming import generate_handler, read_body
from tokenomy.emulator.tokenize import tokenize_routes


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def build_app(config: EmulatorConfig) -> ASGIApp:
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
            "lag_dropped_s": emu.driver.lag_dropped_s, "steps": emu.driver.steps, "busy_s": emu.driver.busy_s,
        })

    async def kv_release(request: Request) -> Response:
        try:
            data = json.loads(await read_body(request.receive, config.max_body_bytes))
            rid = data["remote_request_id"]
        except APIError as err:
            return error_response(err)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            return error_response(APIError(400, "expected a JSON object with remote_request_id",
                                           param="remote_request_id"))
        released = state["emu"].release(str(rid))
        return JSONResponse({"released": released})

    async def retain(request: Request) -> Response:
        try:
            data = json.loads(await read_body(request.receive, config.max_body_bytes))
            rid, ttl = str(data["request_id"]), float(data["ttl_s"])
            if not rid or not 0 <= ttl < float("inf"):
                raise ValueError
        except APIError as err:
            return error_response(err)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
            return error_response(APIError(400, "expected a JSON object with request_id and ttl_s >= 0",
                                           param="request_id"))
        state["emu"].retain_hint(rid, ttl)
        return JSONResponse({"accepted": True})

    async def messages_count_tokens(request: Request) -> Response:
        return await count_tokens(state["emu"], request)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(APIError(404, f"Not found: {request.url.path}"))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(APIError(405, f"Method {request.method} not allowed on {request.url.path}",
                                       type_="MethodNotAllowed"))

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenomy/info", info, methods=["GET"]),
        Route(KV_RELEASE_PATH, kv_release, methods=["POST"]),
        Route(RETAIN_PATH, retain, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages_count_tokens, methods=["POST"]),
    ]

    def emulator() -> Emulator:
        return state["emu"]

    routes += tokenize_routes(emulator)
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_allowed})

    fast = {"/v1/completions": generate_handler(emulator, chat=False),
            "/v1/chat/completions": generate_handler(emulator, chat=True), **agent_handlers(emulator)}

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        handler = fast.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is not None:
            await handler(scope, receive, send)
        else:
            await app(scope, receive, send)

    return asgi
