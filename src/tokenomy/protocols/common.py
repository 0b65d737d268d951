"""What both translations share: the error type, field checks, a chat answer's usage and tool calls."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]


class ProtocolError(ValueError):
    """A request the translation cannot take: answer it with ``status`` (400 unless said) and ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def need_dict(value: Any, param: str) -> JSON:
    if not isinstance(value, dict):
        raise ProtocolError(f"{param} must be an object", param)
    return value


def need_list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError(f"{param} must be an array", param)
    return value


def need_str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{param} must be a string", param)
    return value


def opt_str(body: JSON, key: str, param: str) -> str | None:
    value = body.get(key)
    return None if value is None else need_str(value, param)


def need_int(value: Any, param: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProtocolError(f"{param} must be an integer >= {minimum}", param)
    return value


def copy_numbers(body: JSON, out: JSON, *keys: str) -> None:
    """Copy sampling numbers (``temperature``...) that are present, checking their type."""
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{key} must be a number", key)
        out[key] = value


def dumps(value: Any) -> str:
    """JSON text as Python's ``json.dumps`` writes it by default (vLLM writes tool arguments so)."""
    return json.dumps(value, ensure_ascii=False)


def parse_object(text: str) -> JSON | None:
    """``text`` as a JSON object, or None when it is not one (truncated, garbage, an array)."""
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def short_hash(*parts: str) -> str:
    """A stable 24-hex-digit digest: ids and thinking signatures that a replay reproduces."""
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


def id_tail(chat_id: Any) -> str:
    """The unique part of a chat completion id (``chatcmpl-abc`` -> ``abc``)."""
    text = str(chat_id or "")
    for prefix in ("chatcmpl-", "cmpl-"):
        if text.startswith(prefix):
            return text[len(prefix):] or short_hash(text)
    return text or short_hash("empty")


@dataclass(slots=True)
class Usage:
    """A chat answer's token counts (``prompt`` includes ``cached`` and ``created``, as OpenAI counts)."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    created: int | None = None  # prompt tokens written to the prefix cache (vLLM's created_cache_tokens)
    reasoning: int = 0

    @classmethod
    def of(cls, usage: Any) -> Usage | None:
        """From a chat ``usage`` object; None when there is none."""
        if not isinstance(usage, dict):
            return None
        details = usage.get("prompt_tokens_details") or {}
        out_details = usage.get("completion_tokens_details") or {}
        created = details.get("created_cache_tokens") if isinstance(details, dict) else None
        return cls(
            prompt=_int(usage.get("prompt_tokens")),
            completion=_int(usage.get("completion_tokens")),
            cached=_int(details.get("cached_tokens")) if isinstance(details, dict) else 0,
            created=_int(created) if created is not None else None,
            reasoning=_int(out_details.get("reasoning_tokens")) if isinstance(out_details, dict) else 0,
        )

    def anthropic(self) -> JSON:
        """Anthropic counts: ``input_tokens`` leaves out cache reads and writes."""
        created = self.created or 0
        return {
            "input_tokens": max(0, self.prompt - self.cached - created),
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": self.cached,
            "output_tokens": self.completion,
        }

    def responses(self) -> JSON:
        """Responses counts: ``input_tokens`` includes cached tokens, as chat's ``prompt_tokens`` does."""
        return {
            "input_tokens": self.prompt,
            "input_tokens_details": {"cached_tokens": self.cached, "cache_write_tokens": self.created or 0},
            "output_tokens": self.completion,
            "output_tokens_details": {"reasoning_tokens": self.reasoning},
            "total_tokens": self.prompt + self.completion,
        }


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def sub(obj: JSON, key: str) -> JSON:
    """``obj[key]`` when it is an object, else ``{}``."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def first_choice(resp: JSON) -> JSON:
    """The first choice of a chat answer (``{}`` when there is none)."""
    choices = resp.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def reasoning_of(message: JSON) -> str:
    """A chat message's reasoning text: vLLM writes ``reasoning``, others ``reasoning_content``."""
    value = message.get("reasoning")
    if value is None:
        value = message.get("reasoning_content")
    return value if isinstance(value, str) else ""


@dataclass(slots=True)
class ToolCall:
    """One tool call of a chat answer."""

    id: str
    name: str
    arguments: str


def tool_calls_of(message: JSON, base_id: str) -> list[ToolCall]:
    """A chat message's function calls; a call without an id gets one derived from ``base_id``."""
    out: list[ToolCall] = []
    calls = message.get("tool_calls")
    for i, call in enumerate(calls if isinstance(calls, list) else []):
        if not isinstance(call, dict):
            continue
        fn = sub(call, "function")
        args = fn.get("arguments")
        out.append(ToolCall(
            id=str(call.get("id") or f"call_{base_id}_{i}"),
            name=str(fn.get("name") or ""),
            arguments=args if isinstance(args, str) else dumps(args if args is not None else {}),
        ))
    return out
