"""Server-sent events of a streamed answer, reduced to what the bench measures: one reader per API
(:func:`stream_state`). OpenAI chat and completions chunks (:class:`StreamState`), Anthropic
Messages events (:class:`MessagesStreamState`), OpenAI Responses events
(:class:`ResponsesStreamState`); each keeps the same times, text and an OpenAI-shaped ``usage``,
so every API reports the same metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class StreamError(Exception):
    """The stream itself reported an error (an ``error`` object in a data line)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class StreamState:
    """What one streamed response delivered so far (an OpenAI chat or completions stream; the
    other APIs' readers below keep the same fields).

    ``token_times_s`` holds the arrival time of every chunk that carried generated text (a chunk
    with only a role, or only usage, is not a token); ``usage`` is the last ``usage`` object seen
    (the final chunk when ``stream_options.include_usage`` is set); ``done`` is True once
    ``data: [DONE]`` arrived. ``choice_times_s`` holds the arrival of every chunk with a choice,
    text or not: vLLM streams a chunk for every generated token, with empty text while a token
    ends inside a UTF-8 character (the profiler times steps by them).
    """

    token_times_s: list[float] = field(default_factory=list)
    choice_times_s: list[float] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def feed_line(self, line: str, now_s: float) -> None:
        """Consume one line of the event stream received at ``now_s``.

        Only ``data:`` lines matter (comments, ``event:`` and ``id:`` lines are ignored). Raises
        :class:`StreamError` on an ``error`` payload and ValueError on a data line that is not
        JSON.
        """
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        if not data:
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"stream data is not JSON: {data[:80]!r}") from exc
        if not isinstance(chunk, dict):
            raise ValueError(f"stream data is not a JSON object: {data[:80]!r}")
        self.feed_event(chunk, now_s)

    def token(self, piece: str, now_s: float) -> None:
        """A delta of generated text (or tool-call arguments) arrived at ``now_s``."""
        if piece:
            self.token_times_s.append(now_s)
            self.text_parts.append(piece)

    def feed_event(self, chunk: dict[str, Any], now_s: float) -> None:
        """One parsed ``data:`` object of an OpenAI chat or completions stream."""
        if "error" in chunk:
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            raise StreamError(str(err.get("code") or "stream_error"), str(err.get("message", "")))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or ()
        if choices:
            self.choice_times_s.append(now_s)
        for choice in choices:
            self.token(_choice_text(choice), now_s)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]


def _choice_text(choice: dict[str, Any]) -> str:
    """Generated text of one streamed choice, for both /v1/completions and chat deltas."""
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


def parse_usage(usage: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """``(prompt_tokens, completion_tokens, cached_tokens)`` of an OpenAI usage object, or None
    when absent or malformed; ``cached_tokens`` is 0 when ``prompt_tokens_details`` is absent."""
    if not usage:
        return None
    try:
        prompt = int(usage["prompt_tokens"])
        completion = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0)
    except (KeyError, TypeError, ValueError):
        return None
    return prompt, completion, min(cached, prompt)


ANTHROPIC_ERROR_STATUS = {"invalid_request_error": "400", "authentication_error": "401", "billing_error": "402",
                          "permission_error": "403", "not_found_error": "404", "request_too_large": "413",
                          "rate_limit_error": "429", "api_error": "500", "timeout_error": "504",
                          "overloaded_error": "529"}
"""The HTTP status of each Anthropic error ``type`` (docs.anthropic.com, "Errors"), for an error event
that cuts a Messages stream."""

_MESSAGES_DELTAS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass
class MessagesStreamState(StreamState):
    """An Anthropic Messages stream: every ``content_block_delta`` with text, thinking or tool input
    (``input_json_delta``) is a token; usage from ``message_start`` updated by ``message_delta``
    (Anthropic's ``input_tokens`` leaves out cache reads and writes: the prompt is their sum);
    ``done`` at ``message_stop``; an ``error`` event raises :class:`StreamError` with its status."""

    counts: dict[str, int] = field(default_factory=dict)

    def feed_event(self, chunk: dict[str, Any], now_s: float) -> None:
        kind = chunk.get("type")
        if kind == "content_block_delta":
            delta = _obj(chunk.get("delta"))
            self.choice_times_s.append(now_s)
            key = _MESSAGES_DELTAS.get(str(delta.get("type")))
            piece = delta.get(key) if key else None
            self.token(piece if isinstance(piece, str) else "", now_s)
        elif kind == "message_start":
            self._usage(_obj(chunk.get("message")).get("usage"), final=False)
        elif kind == "message_delta":
            self.finish_reason = _obj(chunk.get("delta")).get("stop_reason") or self.finish_reason
            self._usage(chunk.get("usage"), final=True)
        elif kind == "message_stop":
            self.done = True
        elif kind == "error" or ("error" in chunk and kind is None):
            err = _obj(chunk.get("error"))
            raise StreamError(ANTHROPIC_ERROR_STATUS.get(str(err.get("type")), "stream_error"),
                              str(err.get("message", "")))

    def _usage(self, usage: Any, final: bool) -> None:
        if not isinstance(usage, dict):
            return
        self.counts.update({k: _count(v) for k, v in usage.items() if v is not None})
        if final:
            c = self.counts
            read = c.get("cache_read_input_tokens", 0)
            prompt = c.get("input_tokens", 0) + read + c.get("cache_creation_input_tokens", 0)
            self.usage = {"prompt_tokens": prompt, "completion_tokens": c.get("output_tokens", 0),
                          "prompt_tokens_details": {"cached_tokens": read}}


_RESPONSES_DELTAS = frozenset(f"response.{k}.delta" for k in (
    "output_text", "refusal", "reasoning_text", "reasoning_summary_text", "function_call_arguments",
    "custom_tool_call_input"))
_RESPONSES_END = frozenset(("response.completed", "response.incomplete", "response.failed"))


@dataclass
class ResponsesStreamState(StreamState):
    """An OpenAI Responses stream: every text, reasoning or function-argument ``*.delta`` is a token;
    usage from the final ``response.completed`` (``response.incomplete``), whose status is the finish
    reason; ``response.failed`` and an ``error`` event raise :class:`StreamError` with their code."""

    def feed_event(self, chunk: dict[str, Any], now_s: float) -> None:
        kind = chunk.get("type")
        if kind in _RESPONSES_DELTAS:
            self.choice_times_s.append(now_s)
            delta = chunk.get("delta")
            self.token(delta if isinstance(delta, str) else "", now_s)
        elif kind in _RESPONSES_END:
            resp = _obj(chunk.get("response"))
            if kind == "response.failed":
                err = _obj(resp.get("error"))
                raise StreamError(str(err.get("code") or "response_failed"), str(err.get("message", "")))
            usage = resp.get("usage")
            if isinstance(usage, dict):
                details = _obj(usage.get("input_tokens_details"))
                self.usage = {"prompt_tokens": _count(usage.get("input_tokens")),
                              "completion_tokens": _count(usage.get("output_tokens")),
                              "prompt_tokens_details": {"cached_tokens": _count(details.get("cached_tokens"))}}
            self.finish_reason = str(resp.get("status") or kind)
            self.done = True
        elif kind == "error" or ("error" in chunk and kind is None):
            err = _obj(chunk.get("error"))
            raise StreamError(str(chunk.get("code") or err.get("code") or "stream_error"),
                              str(chunk.get("message") or err.get("message", "")))


STREAMS: dict[str, type[StreamState]] = {"chat": StreamState, "completions": StreamState,
                                         "messages": MessagesStreamState, "responses": ResponsesStreamState}
"""The stream reader of each API (``BenchConfig.api``)."""


def stream_state(api: str) -> StreamState:
    """A fresh reader for one answer streamed by ``api``."""
    try:
        return STREAMS[api]()
    except KeyError:
        raise ValueError(f"unknown api {api!r}; known: {', '.join(STREAMS)}") from None
