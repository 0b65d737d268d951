"""Test support for the gateway's request path: a fake OpenAI upstream and servers on loopback.

The fake upstream's tokens are whitespace-separated words: a chat prompt is ``role: content`` per
message; an answer of n tokens is ``w0 w1 ... w{n-1}`` (n = ``max_tokens``, or ``default_output``).
Its prefix cache reports, as ``cached_tokens``, the longest prefix shared with an earlier prompt
+ answer, in whole blocks of ``block_tokens``, at most the prompt minus one token (as vLLM does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from helpers.polling import wait_for
from helpers.ports import free_port_base
from helpers.prefix_cache import shared_prefix
from tokenomy.gateway.config import DEFAULT_MODEL

MODEL = DEFAULT_MODEL


def free_port() -> int:
    """A free port on 127.0.0.1 below the kernel's ephemeral range (:mod:`helpers.ports`)."""
    return free_port_base(1)


@dataclass
class FakeUpstream:
    model: str = MODEL
    default_output: int = 8
    block_tokens: int = 4
    token_delay_s: float = 0.0
    role_first: bool = False  # a stream opens with a role-only chunk (vLLM's, once the prompt is computed)
    response_delay_s: float = 0.0  # before a non-streamed answer
    fail_status: int | None = None
    seen: list[list[str]] = field(default_factory=list)  # prompt + answer tokens of each finished request
    usages: list[dict[str, Any]] = field(default_factory=list)  # every usage object it reported
    bodies: list[dict[str, Any]] = field(default_factory=list)
    running: int = 0
    aborted: int = 0

    def _prompt(self, body: dict[str, Any]) -> list[str]:
        if "messages" in body:
            return " ".join(f"{m['role']}: {m.get('content') or ''}" for m in body["messages"]).split()
        p = body.get("prompt", "")
        return (p if isinstance(p, str) else " ".join(map(str, p))).split()

    def _cached(self, prompt: list[str]) -> int:
        best = min(shared_prefix(self.seen, prompt), len(prompt) - 1)
        return max(0, best - best % self.block_tokens)

    def app(self) -> Starlette:
        async def completion(request: Request) -> Response:
            body = await request.json()
            self.bodies.append(body)
            if self.fail_status is not None:
                err = {"error": {"message": "injected", "type": "invalid_request_error", "param": None, "code": None}}
                return JSONResponse(err, self.fail_status)
            chat = "messages" in body
            prompt = self._prompt(body)
            n_out = int(body.get("max_tokens") or body.get("max_completion_tokens") or self.default_output)
            cached = self._cached(prompt)
            words = [f"w{i}" for i in range(n_out)]
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n_out, "total_tokens": len(prompt) + n_out,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            self.usages.append(usage)
            if not body.get("stream"):
                if self.response_delay_s:
                    await asyncio.sleep(self.response_delay_s)
                self.seen.append(prompt + (["assistant:"] if chat else []) + words)
                text = " ".join(words)
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                          if chat else {"index": 0, "text": text, "finish_reason": "length"})
                return JSONResponse({"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion",
                                     "model": self.model, "choices": [choice], "usage": usage})
            include = bool((body.get("stream_options") or {}).get("include_usage"))

            async def gen() -> Any:
                self.running += 1
                done = False
                try:
                    if self.role_first and chat:
                        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                        yield f"data: {json.dumps({'id': 'c', 'model': self.model, 'choices': [role]})}\n\n"
                    for i, w in enumerate(words):
                        if self.token_delay_s:
                            await asyncio.sleep(self.token_delay_s)
                        piece = w if i == 0 else " " + w
                        choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": None}
                                  if chat else {"index": 0, "text": piece, "finish_reason": None})
                        yield f"data: {json.dumps({'id': 'c', 'model': self.model, 'choices': [choice]})}\n\n"
                    if include:
                        yield f"data: {json.dumps({'id': 'c', 'model': self.model, 'choices': [], 'usage': usage})}\n\n"
                    yield "data: [DONE]\n\n"
                    done = True
                    self.seen.append(prompt + (["assistant:"] if chat else []) + words)
                finally:
                    self.running -= 1
                    if not done:
                        self.aborted += 1

            return StreamingResponse(gen(), media_type="text/event-stream")

        async def health(request: Request) -> Response:
            return JSONResponse({"status": "ok"})

        async def metrics(request: Request) -> Response:
            text = (
                f'vllm:num_requests_running{{model_name="{self.model}"}} {self.running}\n'
                f'vllm:num_requests_waiting{{model_name="{self.model}"}} 0\n'
                f'vllm:kv_cache_usage_perc{{model_name="{self.model}"}} 0.25\n'
            )
            return PlainTextResponse(text)

        return Starlette(routes=[
            Route("/v1/chat/completions", completion, methods=["POST"]),
            Route("/v1/completions", completion, methods=["POST"]),
            Route("/health", health),
            Route("/metrics", metrics),
        ])


@contextlib.contextmanager
def serve(app: Any, port: int | None = None, timeout_s: float = 10.0, **options: Any) -> Iterator[str]:
    """Run ``app`` with uvicorn on 127.0.0.1 in a thread; yields its base URL; always stops it.
    ``options`` go to ``uvicorn.Config`` (``ssl_certfile``/``ssl_keyfile``: an https server)."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", loop="asyncio", **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool:
        if not thread.is_alive():
            raise RuntimeError(f"server on port {port} did not start")
        return bool(server.started)

    try:
        wait_for(started, timeout_s, interval_s=0.01, what=f"the server on port {port} to start")
        yield f"{'https' if options.get('ssl_certfile') else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
