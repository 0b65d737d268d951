"""The Responses answer's objects: the ``response`` and its output items, as
:func:`tokenomy.protocols.responses.chat_to_responses` and the stream
(:mod:`tokenomy.protocols.responses_stream`) both build them, so their ids and fields agree."""

from __future__ import annotations

from typing import Any

from tokenomy.protocols.common import JSON, Usage


def item_id(prefix: str, base: str, index: int) -> str:
    return f"{prefix}_{base}_{index}"


def reasoning_item(rid: str, text: str, status: str = "completed") -> JSON:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"type": "reasoning", "id": rid, "summary": [], "content": content, "status": status}


def output_text(text: str) -> JSON:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(mid: str, text: str, status: str = "completed") -> JSON:
    content = [output_text(text)] if text and status == "completed" else []
    return {"type": "message", "id": mid, "role": "assistant", "status": status, "content": content}


def function_call_item(fid: str, call_id: str, name: str, arguments: str, status: str = "completed") -> JSON:
    return {"type": "function_call", "id": fid, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def response_object(request: JSON, rid: str, created_at: int, model: str, output: list[JSON],
                    usage: Usage | None, finish_reason: Any) -> JSON:
    """The Response object; ``usage`` None (and status in_progress) while a stream has not ended."""
    status, incomplete = "completed", None
    if usage is None:
        status = "in_progress"
    elif finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    elif finish_reason == "content_filter":
        status, incomplete = "incomplete", {"reason": "content_filter"}
    tools = request.get("tools") if isinstance(request.get("tools"), list) else []
    return {
        "id": rid, "object": "response", "created_at": created_at, "status": status, "error": None,
        "incomplete_details": incomplete, "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"), "metadata": request.get("metadata"),
        "model": model, "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
        "previous_response_id": None, "reasoning": request.get("reasoning"),
        "service_tier": request.get("service_tier", "auto"), "store": False,
        "temperature": request.get("temperature", 1.0), "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto" if tools else "none"), "tools": tools,
        "top_p": request.get("top_p", 1.0), "truncation": request.get("truncation", "disabled"),
        "user": request.get("user"), "background": False,
        "usage": usage.responses() if usage is not None else None,
    }
