"""The bytes of an answer: completions and chat completions, whole or streamed, as vLLM 0.32 writes
them. An :class:`Answer` turns the engine's progress (how many planned tokens are out) into what
the client reads; :mod:`tokenomy.emulator.streaming` drives it, :mod:`tokenomy.emulator.agents`
adds the Anthropic Messages and Responses answers on top of :class:`ChatChunks`.

Plain text streams take a fast path (:class:`TextAnswer`): generated text never needs JSON
escaping (palette words are ASCII letters after a space, see :mod:`tokenomy.emulator.tokenizer`),
so a chunk is a concatenation. A tool call (its arguments are JSON) or usage in every chunk
(``stream_options.continuous_usage_stats``) goes through chunk objects (:class:`ChatAnswer`).
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from tokenomy.emulator.job import Job
from tokenomy.emulator.protocol import APIError

JSON = dict[str, Any]


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def usage_dict(job: Job, completion_tokens: int, created: bool = True) -> JSON:
    """OpenAI usage; ``created``: with vLLM 0.32's ``created_cache_tokens`` (prompt tokens written to
    the prefix cache; its chat answers have it, its completions do not), which the agent protocols
    report as cache writes."""
    details: JSON = {"cached_tokens": job.cached_tokens}
    if created:
        details["created_cache_tokens"] = job.created_cache_tokens
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": job.prompt_tokens + completion_tokens, "prompt_tokens_details": details}


class Answer(Protocol):
    """What a request's answer looks like, given ``n`` of its planned tokens out."""

    def open(self) -> bytes:
        """The stream's first bytes, before any token."""
        ...

    def step(self, sent: int, n: int, done: bool) -> bytes:
        """Tokens ``sent..n`` (``done``: the last ones, with the finish reason)."""
        ...

    def close(self, n: int) -> bytes:
        """After the last step (``n`` tokens in all): usage, end of stream."""
        ...

    def crashed(self, sent: int, n: int, message: str) -> bytes:
        """The engine stopped mid-stream: tokens ``sent..n`` that were out, then an error event."""
        ...

    def whole(self, n: int) -> JSON:
        """The non-streamed answer."""
        ...

    def error_body(self, err: APIError) -> JSON:
        """``err`` in this protocol's shape."""
        ...


class TextAnswer:
    """Completions, and chat completions of plain text, by string concatenation."""

    def __init__(self, job: Job, model: str, chat: bool, include_usage: bool) -> None:
        self.job = job
        self.chat = chat
        self.include_usage = include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + job.request_id
        self.created = int(time.time())
        self.model = model
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = f'data: {{"id":"{self.id}","object":"{obj}","created":{self.created},"model":{json.dumps(model)},'
        if chat:
            self._open = self._head + '"choices":[{"index":0,"delta":{"content":"'
            self._mid = '"},"logprobs":null,"finish_reason":null}]}\n\n'
            self._end = '"},"logprobs":null,"finish_reason":"%s","stop_reason":%s}]}\n\n'
        else:
            self._open = self._head + '"choices":[{"index":0,"text":"'
            self._mid = '","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self._end = '","logprobs":null,"finish_reason":"%s","stop_reason":%s}]}\n\n'

    def _text(self, sent: int, n: int) -> str:
        return "".join(self.job.plan.pieces[sent:n])

    def open(self) -> bytes:
        if not self.chat:
            return b""
        return (self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]}\n\n').encode()

    def step(self, sent: int, n: int, done: bool) -> bytes:
        plan = self.job.plan
        tail = self._end % (plan.finish_reason, json.dumps(plan.matched_stop)) if done else self._mid
        return (self._open + self._text(sent, n) + tail).encode()

    def close(self, n: int) -> bytes:
        tail = b""
        if self.include_usage:
            tail = (self._head + '"choices":[],"usage":').encode() + dumps(usage_dict(self.job, n, self.chat)) + b"}\n\n"
        return tail + b"data: [DONE]\n\n"

    def crashed(self, sent: int, n: int, message: str) -> bytes:
        tokens = self.step(sent, n, False) if n > sent else b""
        return tokens + b"data: " + dumps(APIError(503, message).body()) + b"\n\ndata: [DONE]\n\n"

    def whole(self, n: int) -> JSON:
        plan = self.job.plan
        text = self._text(0, n)
        choice: JSON
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                      "logprobs": None, "finish_reason": plan.finish_reason, "stop_reason": plan.matched_stop}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": plan.finish_reason,
                      "stop_reason": plan.matched_stop, "prompt_logprobs": None}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": usage_dict(self.job, n, self.chat), "kv_transfer_params": self.job.kv_transfer_params}

    def error_body(self, err: APIError) -> JSON:
        return err.body()


class ChatChunks:
    """Chat answers as objects: chunks of a stream and the whole answer, text or one tool call."""

    def __init__(self, job: Job, model: str, *, named_tool: bool = False, continuous_usage: bool = False) -> None:
        self.job = job
        self.model = model
        self.id = "chatcmpl-" + job.request_id
        self.created = int(time.time())
        self.continuous_usage = continuous_usage
        plan = job.plan
        self.call_id = f"chatcmpl-tool-{job.request_id}" if plan.tool_call else None
        # vLLM: a tool call ends with "tool_calls", except a named (forced) one, which ends with "stop"
        self.finish = "tool_calls" if plan.tool_call and plan.finish_reason == "stop" and not named_tool \
            else plan.finish_reason

    def _chunk(self, delta: JSON, finish: str | None, usage: JSON | None) -> JSON:
        choice: JSON = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = self.job.plan.matched_stop
        out: JSON = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                     "choices": [choice]}
        if usage is not None:
            out["usage"] = usage
        return out

    def _running_usage(self, n: int) -> JSON | None:
        if not self.continuous_usage:
            return None
        p = self.job.prompt_tokens
        return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}

    def first(self) -> JSON:
        return self._chunk({"role": "assistant", "content": ""}, None, self._running_usage(0))

    def piece(self, sent: int, n: int, done: bool) -> JSON:
        plan = self.job.plan
        text = "".join(plan.pieces[sent:n])
        delta: JSON
        if plan.tool_call is None:
            delta = {"content": text}
        elif sent == 0 and n > 0:
            delta = {"tool_calls": [{"index": 0, "id": self.call_id, "type": "function",
                                     "function": {"name": plan.tool_call, "arguments": text}}]}
        else:
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]} if text else {}
        return self._chunk(delta, self.finish if done else None, self._running_usage(n))

    def usage(self, n: int) -> JSON:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage_dict(self.job, n)}

    def whole(self, n: int) -> JSON:
        plan = self.job.plan
        text = "".join(plan.pieces[:n])
        message: JSON = {"role": "assistant", "content": text, "tool_calls": []}
        if plan.tool_call is not None:
            message["content"] = ""
            message["tool_calls"] = [{"id": self.call_id, "type": "function",
                                      "function": {"name": plan.tool_call, "arguments": text}}]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish,
                             "stop_reason": plan.matched_stop}],
                "usage": usage_dict(self.job, n),
                "kv_transfer_params": self.job.kv_transfer_params}


class ChatAnswer:
    """Chat completions through :class:`ChatChunks` (tool calls, usage in every chunk)."""

    def __init__(self, chunks: ChatChunks, include_usage: bool) -> None:
        self.chunks = chunks
        self.include_usage = include_usage

    def open(self) -> bytes:
        return b"data: " + dumps(self.chunks.first()) + b"\n\n"

    def step(self, sent: int, n: int, done: bool) -> bytes:
        return b"data: " + dumps(self.chunks.piece(sent, n, done)) + b"\n\n"

    def close(self, n: int) -> bytes:
        usage = b"data: " + dumps(self.chunks.usage(n)) + b"\n\n" if self.include_usage else b""
        return usage + b"data: [DONE]\n\n"

    def crashed(self, sent: int, n: int, message: str) -> bytes:
        tokens = self.step(sent, n, False) if n > sent else b""
        return tokens + b"data: " + dumps(APIError(503, message).body()) + b"\n\ndata: [DONE]\n\n"

    def whole(self, n: int) -> JSON:
        return self.chunks.whole(n)

    def error_body(self, err: APIError) -> JSON:
        return err.body()
