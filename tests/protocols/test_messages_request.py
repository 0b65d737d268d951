"""Anthropic Messages request -> chat request, case by case (vLLM 0.32's conversion is the reference)."""

from __future__ import annotations

from typing import Any

import pytest

from tokenomy.protocols import ProtocolError
from tokenomy.protocols.messages import count_tokens_body, count_tokens_chat, messages_to_chat


def req(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}], **fields}


CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    ("string-content", req(), [{"role": "user", "content": "hi"}]),
    ("system-string", req(system="Be brief."), [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "hi"}]),
    ("system-blocks-joined-cache-control-ignored-billing-header-dropped", req(system=[
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": " Be careful."}]),
     [{"role": "system", "content": "You are Claude Code. Be careful."}, {"role": "user", "content": "hi"}]),
    ("one-text-block-is-a-string", req(messages=[{"role": "user", "content": [{"type": "text", "text": "yo"}]}]),
     [{"role": "user", "content": "yo"}]),
    ("text-and-images", req(messages=[{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}}]}]),
     [{"role": "user", "content": [{"type": "text", "text": "look"},
                                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                   {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}}]}]),
    ("tool-loop", req(messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "use the tool", "signature": "s"},
            {"type": "redacted_thinking", "data": "xyz"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"},
                                                                         {"type": "text", "text": "5C"}]},
            {"type": "text", "text": "and tomorrow?"}]}]),
     [{"role": "user", "content": "weather?"},
      {"role": "assistant", "reasoning": "use the tool", "content": "Checking.",
       "tool_calls": [{"id": "toolu_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "rain\n5C"},
      {"role": "user", "content": "and tomorrow?"}]),
    ("tool-result-only-user-message-and-error-noted", req(messages=[
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
                                          {"type": "tool_use", "id": "t2", "name": "cat", "input": {"p": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a b"},
                                     {"type": "tool_result", "tool_use_id": "t2", "content": "no such file",
                                      "is_error": True}]}]),
     [{"role": "assistant", "tool_calls": [
         {"id": "t1", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
         {"id": "t2", "type": "function", "function": {"name": "cat", "arguments": '{"p": "a"}'}}]},
      {"role": "tool", "tool_call_id": "t1", "content": "a b"},
      {"role": "tool", "tool_call_id": "t2", "content": "Error: no such file"}]),
    ("tool-result-image-follows-as-user", req(messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "shot"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QQ"}}]}]}]),
     [{"role": "tool", "tool_call_id": "t1", "content": "shot"},
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,QQ"}}]}]),
    ("inline-system-message", req(messages=[{"role": "user", "content": "a"},
                                            {"role": "system", "content": "reminder"}]),
     [{"role": "user", "content": "a"}, {"role": "system", "content": "reminder"}]),
]


@pytest.mark.parametrize(("body", "messages"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_messages_convert(body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
    assert messages_to_chat(body)["messages"] == messages


TOOL = {"name": "get_weather", "description": "Weather now", "input_schema": {"properties": {"city": {"type": "string"}},
                                                                              "required": ["city"]}}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

FIELD_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("sampling", req(temperature=0.2, top_p=0.9, top_k=5, stop_sequences=["END"], metadata={"user_id": "u1"}),
     {"max_tokens": 32, "temperature": 0.2, "top_p": 0.9, "top_k": 5, "stop": ["END"], "user": "u1"}),
    ("stream-asks-usage-in-every-chunk", req(stream=True),
     {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("tools-default-to-auto", req(tools=[TOOL]), {"tools": [CHAT_TOOL], "tool_choice": "auto"}),
    ("tool-choice-any", req(tools=[TOOL], tool_choice={"type": "any"}), {"tool_choice": "required"}),
    ("tool-choice-none", req(tools=[TOOL], tool_choice={"type": "none"}), {"tool_choice": "none"}),
    ("tool-choice-named-no-parallel", req(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather",
                                                                      "disable_parallel_tool_use": True}),
     {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False}),
    ("output-format", req(output_config={"format": {"type": "json_schema", "schema": {"type": "object"}},
                                         "effort": "low"}),
     {"response_format": {"type": "json_schema", "json_schema": {"name": "json_schema",
                                                                 "schema": {"type": "object"}}},
      "reasoning_effort": "low"}),
]


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES])
def test_fields_convert(body: dict[str, Any], expected: dict[str, Any]) -> None:
    out = messages_to_chat(body)
    assert {k: out[k] for k in expected} == expected
    assert out["model"] == "tiny"


def test_unknown_fields_are_dropped_and_thinking_config_too() -> None:
    out = messages_to_chat(req(thinking={"type": "enabled", "budget_tokens": 2048}, service_tier="auto",
                               container="c1", anthropic_beta=["x"]))
    assert set(out) == {"model", "messages", "max_tokens"}


BAD: list[tuple[str, Any, str]] = [
    ("not-an-object", [1], "body"),
    ("no-max-tokens", {"model": "m", "messages": []}, "max_tokens"),
    ("zero-max-tokens", req(max_tokens=0), "max_tokens"),
    ("messages-not-a-list", req(messages="hi"), "messages"),
    ("bad-role", req(messages=[{"role": "tool", "content": "x"}]), "messages.0.role"),
    ("unknown-block", req(messages=[{"role": "user", "content": [{"type": "video"}]}]), "messages.0.content.0.type"),
    ("text-not-string", req(messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}]),
     "messages.0.content.0.text"),
    ("named-tool-without-name", req(tools=[TOOL], tool_choice={"type": "tool"}), "tool_choice.name"),
    ("bad-tool-choice", req(tool_choice={"type": "sometimes"}), "tool_choice.type"),
    ("tool-without-schema", req(tools=[{"name": "x"}]), "tools.0.input_schema"),
    ("temperature-string", req(temperature="hot"), "temperature"),
    ("stop-not-list", req(stop_sequences="END"), "stop_sequences"),
    ("system-image", req(system=[{"type": "image"}]), "system.0"),
]


@pytest.mark.parametrize(("body", "param"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_requests_name_the_field(body: Any, param: str) -> None:
    with pytest.raises(ProtocolError) as err:
        messages_to_chat(body)
    assert err.value.param == param and err.value.status == 400 and err.value.message


def test_count_tokens_needs_no_max_tokens_and_counts_everything() -> None:
    body = {"model": "tiny", "system": "sys", "tools": [TOOL], "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {"city": "X"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "sunny"}]}]}
    chat = count_tokens_chat(body)
    assert "max_tokens" not in chat and chat["tools"] == [CHAT_TOOL]
    text = count_tokens_body(body)
    for piece in ("sys", "q", "get_weather", '{"city": "X"}', "sunny", "Weather now"):
        assert piece in text
