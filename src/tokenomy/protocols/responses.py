"""OpenAI Responses (``POST /v1/responses``) to and from OpenAI chat completions.

Request (:func:`responses_to_chat`), as vLLM 0.32 builds chat messages from a Responses request
(``vllm/entrypoints/openai/responses/utils.py``, ``construct_input_messages``): ``instructions``
is the leading system message; ``input`` is a user message (a string) or items: ``message``
(role user/system/developer/assistant; content a string or parts ``input_text`` /
``output_text`` / ``input_image``), ``function_call`` (an assistant ``tool_calls`` entry; calls
that follow an assistant message, or each other, join that message), ``function_call_output``
(a ``role: tool`` message), ``reasoning`` (the assistant message's ``reasoning`` field, from its
content or else its summary; an item with only ``encrypted_content`` is dropped, where vLLM
refuses it). Function tools (flat: name, description, parameters, strict) become chat tools;
``tool_choice``, ``max_output_tokens`` (-> ``max_tokens``), ``temperature``, ``top_p``,
``parallel_tool_calls``, ``user``, ``text.format`` (-> ``response_format``),
``reasoning.effort`` (-> ``reasoning_effort``), ``stream`` (with usage in every chunk) and
vLLM's extras ``top_k``, ``seed``, ``stop``, ``ignore_eos`` carry over; other fields are dropped.
Refused (:class:`ProtocolError`): hosted tools (web search, file search...: a chat backend cannot
run them), ``previous_response_id`` (404, as vLLM without a response store: nothing is stored),
a forced tool choice without that tool.

Answer (:func:`chat_to_responses`): a ``response`` object whose output items are reasoning,
message (``output_text``) and ``function_call`` items, with ids derived from the chat id (so a
replay gives the same ids, and the streamed and whole answers agree), usage with cached and
reasoning token details, and the request's fields echoed as the openai SDK reads them.
The stream is :class:`tokenomy.protocols.responses_stream.ChatToResponsesStream`.
"""

from __future__ import annotations

import time
from typing import Any

from tokenomy.protocols.common import (
    JSON,
    ProtocolError,
    Usage,
    copy_numbers,
    first_choice,
    id_tail,
    need_dict,
    need_int,
    need_list,
    need_str,
    reasoning_of,
    sub,
    tool_calls_of,
)
from tokenomy.protocols.response_objects import (
    function_call_item,
    item_id,
    message_item,
    reasoning_item,
    response_object,
)
from tokenomy.protocols.responses_stream import ChatToResponsesStream

__all__ = ["ChatToResponsesStream", "chat_to_responses", "responses_to_chat"]

_EXTRAS = ("seed", "stop", "ignore_eos", "kv_transfer_params")  # vLLM's Responses extensions


def responses_to_chat(body: JSON) -> JSON:
    """A Responses request as an OpenAI chat-completions request (see the module doc)."""
    need_dict(body, "body")
    if body.get("previous_response_id") is not None:
        raise ProtocolError(f"Response with id '{body['previous_response_id']}' not found.",
                            "previous_response_id", status=404)
    out: JSON = {}
    if body.get("model") is not None:
        out["model"] = need_str(body["model"], "model")
    messages: list[JSON] = []
    instructions = body.get("instructions")
    if instructions:
        messages.append({"role": "system", "content": need_str(instructions, "instructions")})
    source = body.get("input")
    if isinstance(source, str):
        messages.append({"role": "user", "content": source})
    else:
        for i, item in enumerate(need_list(source, "input")):
            _convert_item(need_dict(item, f"input.{i}"), f"input.{i}", messages)
    out["messages"] = messages
    _convert_tools(body, out)
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = need_int(body["max_output_tokens"], "max_output_tokens", 1)
    copy_numbers(body, out, "temperature", "top_p", "top_k")
    for key in _EXTRAS:
        if body.get(key) is not None:
            out[key] = body[key]
    if isinstance(body.get("user"), str):
        out["user"] = body["user"]
    if isinstance(body.get("parallel_tool_calls"), bool):
        out["parallel_tool_calls"] = body["parallel_tool_calls"]
    _convert_text_format(body, out)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        out["reasoning_effort"] = reasoning["effort"]
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ProtocolError("stream must be a boolean", "stream")
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return out


def chat_to_responses(resp: JSON, request: JSON, created_at: int | None = None) -> JSON:
    """A (non-streamed) chat completion as the Response object answering ``request``."""
    need_dict(resp, "response")
    choice = first_choice(resp)
    message = sub(choice, "message")
    base = id_tail(resp.get("id"))
    output: list[JSON] = []
    reasoning = reasoning_of(message)
    if reasoning:
        output.append(reasoning_item(item_id("rs", base, len(output)), reasoning))
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    calls = tool_calls_of(message, base)
    if text or not calls:
        output.append(message_item(item_id("msg", base, len(output)), text))
    for call in calls:
        output.append(function_call_item(item_id("fc", base, len(output)), call.id, call.name, call.arguments))
    usage = Usage.of(resp.get("usage")) or Usage()
    created = created_at if created_at is not None else int(resp.get("created") or time.time())
    return response_object(request, f"resp_{base}", created, str(resp.get("model") or request.get("model") or ""),
                           output, usage, choice.get("finish_reason"))


# ---- request parts -------------------------------------------------------------------------
def _part_text(part: JSON, where: str) -> JSON:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": need_str(part.get("text"), f"{where}.text")}
    if kind == "refusal":
        return {"type": "text", "text": need_str(part.get("refusal"), f"{where}.refusal")}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise ProtocolError(f"{where}.image_url is required (file ids are not supported)", f"{where}.image_url")
        image: JSON = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise ProtocolError(f"{where}.type: unsupported content part type {kind!r}", f"{where}.type")


def _content(content: Any, where: str) -> str | list[JSON]:
    if isinstance(content, str):
        return content
    parts = [_part_text(need_dict(p, f"{where}.{j}"), f"{where}.{j}")
             for j, p in enumerate(need_list(content, where))]
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts) if len(parts) <= 1 else parts
    return parts


def _last_assistant(messages: list[JSON]) -> JSON | None:
    return messages[-1] if messages and messages[-1].get("role") == "assistant" else None


def _convert_item(item: JSON, where: str, out: list[JSON]) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    prev = _last_assistant(out)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise ProtocolError(f"{where}.role must be user, system, developer or assistant, got {role!r}",
                                f"{where}.role")
        content = _content(item.get("content"), f"{where}.content")
        if role == "assistant":
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
            if prev is not None and prev.get("content") is None:
                prev["content"] = text
            else:
                out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": role, "content": content})
    elif kind == "function_call":
        call = {"id": need_str(item.get("call_id"), f"{where}.call_id"), "type": "function",
                "function": {"name": need_str(item.get("name"), f"{where}.name"),
                             "arguments": need_str(item.get("arguments", ""), f"{where}.arguments")}}
        if prev is not None:
            prev.setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else "".join(
            p.get("text", "") for p in need_list(output, f"{where}.output") if isinstance(p, dict))
        out.append({"role": "tool", "tool_call_id": need_str(item.get("call_id"), f"{where}.call_id"),
                    "content": text})
    elif kind == "reasoning":
        thought = _reasoning_text(item)
        if thought is None:
            return
        if prev is not None and prev.get("reasoning") is None:
            prev["reasoning"] = thought
        else:
            out.append({"role": "assistant", "reasoning": thought})
    else:
        raise ProtocolError(f"{where}.type: unsupported input item type {kind!r}", f"{where}.type")


def _reasoning_text(item: JSON) -> str | None:
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts and isinstance(parts[0], dict) and isinstance(parts[0].get("text"), str):
            return str(parts[0]["text"])
    return None


def _convert_tools(body: JSON, out: JSON) -> None:
    tools = body.get("tools") or []
    names: list[str] = []
    converted = []
    for i, tool in enumerate(need_list(tools, "tools")):
        tool = need_dict(tool, f"tools.{i}")
        if tool.get("type") != "function":
            raise ProtocolError(f"tools.{i}.type: only function tools can be served by a chat backend, "
                                f"got {tool.get('type')!r}", f"tools.{i}.type")
        fn: JSON = {"name": need_str(tool.get("name"), f"tools.{i}.name")}
        if tool.get("description") is not None:
            fn["description"] = need_str(tool["description"], f"tools.{i}.description")
        fn["parameters"] = need_dict(tool.get("parameters") or {"type": "object", "properties": {}},
                                     f"tools.{i}.parameters")
        if tool.get("strict") is not None:
            fn["strict"] = bool(tool["strict"])
        names.append(fn["name"])
        converted.append({"type": "function", "function": fn})
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise ProtocolError(f"tool_choice.type {choice.get('type')!r} is not supported", "tool_choice")
        if choice.get("name") not in names:
            raise ProtocolError("Tool choice 'function' not found in 'tools' parameter.", "tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice == "required":
        if not names:
            raise ProtocolError("Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice")
        out["tool_choice"] = "required"
    elif choice in ("auto", "none", None):
        if names:
            out["tool_choice"] = choice or "auto"
    else:
        raise ProtocolError(f"tool_choice must be auto, none, required or a function, got {choice!r}",
                            "tool_choice")
    if converted:
        out["tools"] = converted


def _convert_text_format(body: JSON, out: JSON) -> None:
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return
    if fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    elif fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema: JSON = {"name": str(fmt.get("name") or "response"), "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            schema["strict"] = bool(fmt["strict"])
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
