"""OpenAI Responses request -> chat request, case by case (vLLM 0.32's conversion is the reference)."""

from __future__ import annotations

from typing import Any

import pytest

from tokenomy.protocols import ProtocolError
from tokenomy.protocols.responses import responses_to_chat

FN = {"type": "function", "name": "get_weather", "description": "Weather now", "strict": True,
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_FN = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": FN["parameters"], "strict": True}}


def req(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "input": "hi", **fields}


CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    ("string-input", req(), [{"role": "user", "content": "hi"}]),
    ("instructions-first", req(instructions="Be brief."), [{"role": "system", "content": "Be brief."},
                                                           {"role": "user", "content": "hi"}]),
    ("message-items-and-parts", req(input=[
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"},
                                                        {"type": "input_image", "image_url": "https://x/a.png",
                                                         "detail": "low"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one part"}]}]),
     [{"role": "developer", "content": "rules"},
      {"role": "user", "content": [{"type": "text", "text": "look"},
                                   {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}}]},
      {"role": "user", "content": "one part"}]),
    ("tool-loop-merges-calls", req(input=[
        {"role": "user", "content": "weather in two cities?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "two calls"}]},
        {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "sun"}]}]),
     [{"role": "user", "content": "weather in two cities?"},
      {"role": "assistant", "reasoning": "two calls", "content": "Checking.", "tool_calls": [
          {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
          {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "rain"},
      {"role": "tool", "tool_call_id": "c2", "content": "sun"}]),
    ("call-without-preceding-assistant", req(input=[
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]),
     [{"role": "user", "content": "x"},
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                            "function": {"name": "f", "arguments": "{}"}}]}]),
    ("encrypted-reasoning-dropped-summary-used", req(input=[
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "sum"}]},
        {"role": "user", "content": "x"}]),
     [{"role": "assistant", "reasoning": "sum"}, {"role": "user", "content": "x"}]),
]


@pytest.mark.parametrize(("body", "messages"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_input_converts(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    assert responses_to_chat(body)["messages"] == messages


FIELD_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("sampling", req(max_output_tokens=20, temperature=0.5, top_p=0.8, user="u", parallel_tool_calls=False,
                     seed=3, stop=["X"], top_k=4, ignore_eos=True),
     {"max_tokens": 20, "temperature": 0.5, "top_p": 0.8, "user": "u", "parallel_tool_calls": False, "seed": 3,
      "stop": ["X"], "top_k": 4, "ignore_eos": True}),
    ("stream", req(stream=True), {"stream": True, "stream_options": {"include_usage": True,
                                                                     "continuous_usage_stats": True}}),
    ("tools-auto", req(tools=[FN]), {"tools": [CHAT_FN], "tool_choice": "auto"}),
    ("tools-required", req(tools=[FN], tool_choice="required"), {"tool_choice": "required"}),
    ("tools-named", req(tools=[FN], tool_choice={"type": "function", "name": "get_weather"}),
     {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ("json-schema", req(text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"},
                                         "strict": True}}),
     {"response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"},
                                                                 "strict": True}}}),
    ("json-object-and-effort", req(text={"format": {"type": "json_object"}}, reasoning={"effort": "high"}),
     {"response_format": {"type": "json_object"}, "reasoning_effort": "high"}),
]


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES])
def test_fields_convert(body: dict[str, Any], expected: dict[str, Any]) -> None:
    out = responses_to_chat(body)
    assert {k: out[k] for k in expected} == expected


def test_unknown_fields_dropped_and_no_tool_choice_without_tools() -> None:
    out = responses_to_chat(req(store=True, truncation="auto", include=["x"], metadata={"a": "b"}, tool_choice="auto"))
    assert set(out) == {"model", "messages"}


BAD: list[tuple[str, Any, str, int]] = [
    ("not-an-object", "x", "body", 400),
    ("no-input", {"model": "m"}, "input", 400),
    ("previous-response", req(previous_response_id="resp_1"), "previous_response_id", 404),
    ("hosted-tool", req(tools=[{"type": "web_search"}]), "tools.0.type", 400),
    ("required-without-tools", req(tool_choice="required"), "tool_choice", 400),
    ("named-missing", req(tools=[FN], tool_choice={"type": "function", "name": "nope"}), "tool_choice", 400),
    ("zero-max-output", req(max_output_tokens=0), "max_output_tokens", 400),
    ("unknown-item", req(input=[{"type": "item_reference", "id": "x"}]), "input.0.type", 400),
    ("file-input", req(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
     "input.0.content.0.type", 400),
    ("bad-role", req(input=[{"role": "tool", "content": "x"}]), "input.0.role", 400),
    ("call-without-id", req(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]), "input.0.call_id", 400),
    ("stream-not-bool", req(stream="yes"), "stream", 400),
]


@pytest.mark.parametrize(("body", "param", "status"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_requests_name_the_field(body: Any, param: str, status: int) -> None:
    with pytest.raises(ProtocolError) as err:
        responses_to_chat(body)
    assert (err.value.param, err.value.status) == (param, status) and err.value.message
