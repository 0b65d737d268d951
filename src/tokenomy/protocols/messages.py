"""Anthropic Messages (``POST /v1/messages``) to and from OpenAI chat completions.

Request (:func:`messages_to_chat`), as vLLM 0.32 converts it
(``vllm/entrypoints/anthropic/serving.py``), so a gateway's chat backend sees the very messages
vLLM's own ``/v1/messages`` would render:

* ``system`` (a string or text blocks, ``cache_control`` ignored) becomes one leading system
  message, the blocks' texts joined without a separator; a block that starts with
  ``x-anthropic-billing-header`` (Claude Code's per-request hash) is left out, since it would
  defeat prefix caching. A message with role ``system`` (a vLLM extension) becomes a system
  message in place.
* Blocks: ``text`` and ``image`` (base64 becomes a ``data:`` URL) become content parts (one text
  part becomes a plain string); assistant ``tool_use`` becomes ``tool_calls`` (ids kept, input as
  a JSON string); user ``tool_result`` becomes a ``role: tool`` message placed before the rest of
  that user message (text blocks joined by newlines, images in a user message after it).
  Unlike vLLM, ``is_error: true`` is not lost: the tool message's text starts with ``Error: ``.
  ``thinking`` becomes the assistant message's ``reasoning`` field (as vLLM; a chat template that
  does not render reasoning drops it from the prompt); ``redacted_thinking`` is dropped.
* ``tools`` become function tools; ``tool_choice`` auto/any/tool/none becomes
  auto/required/{function}/none (``disable_parallel_tool_use`` -> ``parallel_tool_calls``);
  tools without a choice mean ``auto``. ``max_tokens``, ``stop_sequences`` (-> ``stop``),
  ``temperature``, ``top_p``, ``top_k``, ``metadata.user_id`` (-> ``user``),
  ``output_config.format`` (-> ``response_format``), ``output_config.effort``
  (-> ``reasoning_effort``) and ``stream`` (with usage in every chunk) carry over; ``thinking``
  and other fields are dropped.

Answer (:func:`chat_to_messages`): content blocks thinking, text, tool_use in that order; a tool
call whose arguments are not a JSON object gets ``input: {}`` (a client's tool then reports the
missing parameters, and the model can retry; the non-streamed and the streamed answer agree).
The stream is :class:`tokenomy.protocols.messages_stream.ChatToMessagesStream`.
"""

from __future__ import annotations

from typing import Any

from tokenomy.protocols.common import (
    JSON,
    ProtocolError,
    Usage,
    copy_numbers,
    dumps,
    first_choice,
    id_tail,
    need_dict,
    need_int,
    need_list,
    need_str,
    parse_object,
    reasoning_of,
    short_hash,
    sub,
    tool_calls_of,
)
from tokenomy.protocols.messages_stream import ChatToMessagesStream, stop_reason

__all__ = ["ChatToMessagesStream", "chat_to_messages", "count_tokens_body", "count_tokens_chat",
           "messages_to_chat"]

BILLING_HEADER = "x-anthropic-billing-header"
_PASS_THROUGH = ("kv_transfer_params", "cache_salt")  # vLLM extensions its /v1/messages accepts too


def messages_to_chat(body: JSON) -> JSON:
    """An Anthropic Messages request as an OpenAI chat-completions request (see the module doc)."""
    need_dict(body, "body")
    out = count_tokens_chat(body)
    if body.get("max_tokens") is None:
        raise ProtocolError("max_tokens: Field required", "max_tokens")
    out["max_tokens"] = need_int(body["max_tokens"], "max_tokens", 1)
    stops = body.get("stop_sequences")
    if stops is not None:
        out["stop"] = [need_str(s, "stop_sequences") for s in need_list(stops, "stop_sequences")]
    copy_numbers(body, out, "temperature", "top_p", "top_k")
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        out["user"] = metadata["user_id"]
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ProtocolError("stream must be a boolean", "stream")
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    for key in _PASS_THROUGH:
        if body.get(key) is not None:
            out[key] = body[key]
    return out


def count_tokens_chat(body: JSON) -> JSON:
    """The chat request whose prompt ``/v1/messages/count_tokens`` counts: model, messages, tools
    and tool choice (no sampling fields). A server with a chat template renders this."""
    need_dict(body, "body")
    out: JSON = {}
    if body.get("model") is not None:
        out["model"] = need_str(body["model"], "model")
    messages: list[JSON] = []
    system = _system_text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for i, msg in enumerate(need_list(body.get("messages"), "messages")):
        _convert_message(need_dict(msg, f"messages.{i}"), f"messages.{i}", messages)
    out["messages"] = messages
    _convert_tools(body, out)
    _convert_output_config(body, out)
    return out


def count_tokens_body(body: JSON) -> str:
    """The text a tokenizer counts for ``/v1/messages/count_tokens`` where no chat template is at
    hand (a gateway's estimate): system, every message's text, tool calls and results, tool
    definitions, one per line. A server with the model's template renders
    :func:`count_tokens_chat` instead (vLLM does)."""
    chat = count_tokens_chat(body)
    lines: list[str] = []
    for msg in chat["messages"]:
        content = msg.get("content")
        if isinstance(content, str):
            lines.append(content)
        elif isinstance(content, list):
            lines.extend(p["text"] for p in content if p.get("type") == "text")
        for call in msg.get("tool_calls", []):
            lines.append(f"{call['function']['name']} {call['function']['arguments']}")
        if msg.get("reasoning"):
            lines.append(msg["reasoning"])
    for tool in chat.get("tools", []):
        lines.append(dumps(tool["function"]))
    return "\n".join(line for line in lines if line)


def chat_to_messages(resp: JSON, model: str) -> JSON:
    """A (non-streamed) chat completion as an Anthropic Messages answer for ``model``."""
    need_dict(resp, "response")
    choice = first_choice(resp)
    message = sub(choice, "message")
    tail = id_tail(resp.get("id"))
    content: list[JSON] = []
    thinking = reasoning_of(message)
    if thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": short_hash(tail, thinking)})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = tool_calls_of(message, tail)
    for call in calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name,
                        "input": parse_object(call.arguments) or {}})
    if not content:
        content.append({"type": "text", "text": ""})  # strict clients read content[0]
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), bool(calls))
    usage = Usage.of(resp.get("usage")) or Usage()
    return {
        "id": f"msg_{tail}", "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": reason, "stop_sequence": sequence, "usage": usage.anthropic(),
    }


# ---- request parts -------------------------------------------------------------------------
def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return "" if system.startswith(BILLING_HEADER) else system
    parts: list[str] = []
    for i, block in enumerate(need_list(system, "system")):
        block = need_dict(block, f"system.{i}")
        if block.get("type") != "text":
            raise ProtocolError(f"system.{i}: only text blocks are allowed in system", f"system.{i}")
        text = need_str(block.get("text"), f"system.{i}.text")
        if text and not text.startswith(BILLING_HEADER):
            parts.append(text)
    return "".join(parts)


def _convert_message(msg: JSON, where: str, out: list[JSON]) -> None:
    role = msg.get("role")
    if role not in ("user", "assistant", "system"):
        raise ProtocolError(f"{where}.role must be 'user' or 'assistant', got {role!r}", f"{where}.role")
    content = msg.get("content")
    if role == "system":
        text = _system_text(content)
        if text:
            out.append({"role": "system", "content": text})
        return
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    parts: list[JSON] = []
    calls: list[JSON] = []
    reasoning: list[str] = []
    for j, block in enumerate(need_list(content, f"{where}.content")):
        _convert_block(need_dict(block, f"{where}.content.{j}"), role, f"{where}.content.{j}",
                       parts, calls, reasoning, out)
    chat: JSON = {"role": role}
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if parts:
        chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    if role == "user" and "content" not in chat:
        return  # only tool results: they are the tool messages already added
    out.append(chat)


def _convert_block(block: JSON, role: str, where: str, parts: list[JSON], calls: list[JSON],
                   reasoning: list[str], out: list[JSON]) -> None:
    kind = block.get("type")
    if kind == "text":
        text = need_str(block.get("text"), f"{where}.text")
        if text:
            parts.append({"type": "text", "text": text})
    elif kind == "image":
        parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), where)}})
    elif kind == "thinking":
        if isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
    elif kind in ("redacted_thinking", "tool_reference"):
        pass
    elif kind == "tool_use":
        name = need_str(block.get("name"), f"{where}.name")
        args = block.get("input")
        calls.append({"id": str(block.get("id") or f"toolu_{short_hash(where, name)}"), "type": "function",
                      "function": {"name": name, "arguments": dumps(args if args is not None else {})}})
    elif kind == "tool_result":
        if role == "user":
            _tool_result(block, where, out)
        else:
            parts.append({"type": "text", "text": f"Tool result: {_result_text(block, where)}"})
    else:
        raise ProtocolError(f"{where}.type: unsupported content block type {kind!r}", f"{where}.type")


def _image_url(source: Any, where: str) -> str:
    source = need_dict(source, f"{where}.source")
    if source.get("type") == "url":
        return need_str(source.get("url"), f"{where}.source.url")
    media = source.get("media_type") or "image/jpeg"
    return f"data:{media};base64,{need_str(source.get('data'), f'{where}.source.data')}"


def _result_text(block: JSON, where: str) -> str:
    content = block.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    texts = [need_str(item.get("text"), f"{where}.content.text") for item in need_list(content, f"{where}.content")
             if isinstance(item, dict) and item.get("type") == "text"]
    return "\n".join(texts)


def _tool_result(block: JSON, where: str, out: list[JSON]) -> None:
    text = _result_text(block, where)
    if block.get("is_error") is True:
        text = f"Error: {text}"
    out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": text})
    content = block.get("content")
    images = [item for item in content if isinstance(item, dict) and item.get("type") == "image"] \
        if isinstance(content, list) else []
    if images:
        out.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _image_url(img.get("source"), where)}} for img in images]})


def _convert_tools(body: JSON, out: JSON) -> None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice is not None:
        choice = need_dict(choice, "tool_choice")
        kind = choice.get("type")
        if kind == "auto":
            out["tool_choice"] = "auto"
        elif kind == "any":
            out["tool_choice"] = "required"
        elif kind == "none":
            out["tool_choice"] = "none"
        elif kind == "tool":
            name = choice.get("name")
            if not isinstance(name, str) or not name:
                raise ProtocolError("tool_choice.name is required when type is 'tool'", "tool_choice.name")
            out["tool_choice"] = {"type": "function", "function": {"name": name}}
        else:
            raise ProtocolError(f"tool_choice.type must be auto, any, tool or none, got {kind!r}",
                                "tool_choice.type")
        if choice.get("disable_parallel_tool_use") is not None:
            out["parallel_tool_calls"] = not bool(choice["disable_parallel_tool_use"])
    if tools is None:
        return
    converted = []
    for i, tool in enumerate(need_list(tools, "tools")):
        tool = need_dict(tool, f"tools.{i}")
        fn: JSON = {"name": need_str(tool.get("name"), f"tools.{i}.name")}
        if tool.get("description") is not None:
            fn["description"] = need_str(tool["description"], f"tools.{i}.description")
        schema = dict(need_dict(tool.get("input_schema"), f"tools.{i}.input_schema"))
        schema.setdefault("type", "object")
        fn["parameters"] = schema
        if tool.get("strict") is not None:
            fn["strict"] = bool(tool["strict"])
        converted.append({"type": "function", "function": fn})
    out["tools"] = converted
    out.setdefault("tool_choice", "auto")


def _convert_output_config(body: JSON, out: JSON) -> None:
    config = body.get("output_config")
    if not isinstance(config, dict):
        return
    fmt = config.get("format")
    if isinstance(fmt, dict) and isinstance(fmt.get("schema"), dict):
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "json_schema", "schema": fmt["schema"]}}
    if isinstance(config.get("effort"), str):
        out["reasoning_effort"] = config["effort"]
