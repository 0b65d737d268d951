"""Server-sent events of an OpenAI streaming response, reduced to what the bench measures."""

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
    """What one streamed response delivered so far.

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
        if "error" in chunk:
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            raise StreamError(str(err.get("code") or "stream_error"), str(err.get("message", "")))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or ()
        if choices:
            self.choice_times_s.append(now_s)
        for choice in choices:
            piece = _choice_text(choice)
            if piece:
                self.token_times_s.append(now_s)
                self.text_parts.append(piece)
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
