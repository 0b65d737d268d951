"""What the bench sends for one turn, in each API (``BenchConfig.api``): the path, the headers and
the JSON body.

:func:`request_body` builds the OpenAI chat (or completions) body; for the agent protocols the same
conversation is then rewritten as an Anthropic Messages body (:func:`messages_body`) or an OpenAI
Responses body (:func:`responses_body`), the way coding agents send them:

* Messages: the system prompt as one ``system`` text block with ``cache_control: ephemeral``;
  ``metadata.user_id`` a JSON string ``{"session_id": ...}`` (as Claude Code sends it).
* Responses: the system prompt as ``instructions``; ``prompt_cache_key`` the session id,
  ``store: false`` (the whole history is sent every turn, as Codex does).

With ``tool_calls`` (agent workloads: new input after an answer is a tool's result), an answer that
is followed by new input is re-sent as its text plus one call of :data:`TOOL_NAME` with empty
arguments (Messages ``tool_use``, Responses ``function_call``), and that input as the call's result
(``tool_result``, ``function_call_output``). Call ids are numbered by the answer's place in the
conversation, so a re-sent history is byte-identical turn after turn. No ``tools`` are declared:
the workload's system prompt stands for the tool descriptions (docs/bench.md, "--api").

``max_tokens`` (Messages) or ``max_output_tokens`` (Responses) is the workload's output length,
and ``ignore_eos`` is sent as for chat (vLLM's Responses honours it; its Messages endpoint drops
fields it does not know).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenomy.bench.config import BenchConfig
from tokenomy.bench.text import Prompt

API_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
             "messages": "/v1/messages", "responses": "/v1/responses"}
"""The endpoint each API posts to, under the target's base URL."""

ANTHROPIC_VERSION = "2023-06-01"
TOOL_NAME = "tool"
"""The one tool the replayed agent calls (its arguments are empty; its result is the workload's)."""


def auth_headers(api: str, key: str | None) -> dict[str, str]:
    """Authentication of every request: a bearer token; for Messages also ``x-api-key`` and the
    ``anthropic-version`` the anthropic SDK sends."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if api == "messages":
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if key:
            headers["x-api-key"] = key
    return headers


def request_body(config: BenchConfig, prompt: Prompt, max_tokens: int, session_id: str = "") -> dict[str, Any]:
    """The JSON body: streamed, usage included, exactly ``max_tokens`` when ``ignore_eos``; in the
    agent protocols, the chat body rewritten (``session_id`` goes where the protocol carries it)."""
    body: dict[str, Any] = {
        "model": config.model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.api == "completions":
        body["prompt"] = prompt.text
    else:
        body["messages"] = [dict(m) for m in prompt.messages]
    if config.ignore_eos:
        body["ignore_eos"] = True
    if config.api == "messages":
        return messages_body(body, session_id, tool_calls=config.tool_calls)
    if config.api == "responses":
        return responses_body(body, session_id, tool_calls=config.tool_calls)
    return body


@dataclass(frozen=True, slots=True)
class _Message:
    role: str
    text: str
    call: int = 0  # an assistant answer that is tool call number ``call`` (0: none)
    result_of: int = 0  # a user message that is the result of tool call number ``result_of`` (0: none)


def _conversation(messages: list[dict[str, str]], tool_calls: bool) -> tuple[str | None, list[_Message]]:
    """The system prompt (a leading ``system`` message) and the rest, answers followed by new input
    marked as tool calls and that input as their results."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
    rest = messages[1:] if system is not None else messages
    out: list[_Message] = []
    calls = 0
    for i, m in enumerate(rest):
        role, text = m["role"], m["content"]
        if role == "assistant" and tool_calls and i + 1 < len(rest) and rest[i + 1]["role"] == "user":
            calls += 1
            out.append(_Message(role, text, call=calls))
        elif role == "user" and out and out[-1].call:
            out.append(_Message(role, text, result_of=out[-1].call))
        else:
            out.append(_Message(role, text))
    return system, out


def _extras(chat: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    if chat.get("ignore_eos"):
        out["ignore_eos"] = True
    return out


def messages_body(chat: dict[str, Any], session_id: str, *, tool_calls: bool = True) -> dict[str, Any]:
    """The Anthropic Messages body of the chat body ``chat``."""
    system, conversation = _conversation(chat["messages"], tool_calls)
    messages: list[dict[str, Any]] = []
    for m in conversation:
        if m.result_of:
            blocks: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": f"toolu_{m.result_of}",
                                             "content": m.text}]
        else:
            blocks = [{"type": "text", "text": m.text}]
        if m.call:
            blocks.append({"type": "tool_use", "id": f"toolu_{m.call}", "name": TOOL_NAME, "input": {}})
        if messages and messages[-1]["role"] == m.role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": m.role, "content": blocks})
    body: dict[str, Any] = {"model": chat["model"], "max_tokens": chat["max_tokens"], "stream": True}
    if system is not None:
        body["system"] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    body["messages"] = messages
    body["metadata"] = {"user_id": json.dumps({"session_id": session_id})}
    return _extras(chat, body)


def responses_body(chat: dict[str, Any], session_id: str, *, tool_calls: bool = True) -> dict[str, Any]:
    """The OpenAI Responses body of the chat body ``chat``."""
    system, conversation = _conversation(chat["messages"], tool_calls)
    items: list[dict[str, Any]] = []
    for m in conversation:
        if m.result_of:
            items.append({"type": "function_call_output", "call_id": f"call_{m.result_of}", "output": m.text})
        else:
            items.append({"type": "message", "role": m.role, "content": m.text})
        if m.call:
            items.append({"type": "function_call", "call_id": f"call_{m.call}", "name": TOOL_NAME,
                          "arguments": "{}"})
    body: dict[str, Any] = {"model": chat["model"], "max_output_tokens": chat["max_tokens"], "stream": True}
    if system is not None:
        body["instructions"] = system
    body.update(input=items, store=False, prompt_cache_key=session_id)
    return _extras(chat, body)
