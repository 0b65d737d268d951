"""Chat answer -> Anthropic Messages answer, whole (``chat_to_messages``) and streamed
(``ChatToMessagesStream``), the stream replayed through the real anthropic SDK."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import Message
from sdk_replay import CHAT_ID, anthropic_final, chunk, tool_delta, usage

from tokenomy.protocols.messages import ChatToMessagesStream, chat_to_messages


def whole(message: dict[str, Any], finish: str = "stop", stop_reason: Any = None,
          use: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": CHAT_ID, "object": "chat.completion", "model": "tiny", "usage": use or usage(10, 4, cached=6),
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish,
                         "stop_reason": stop_reason}]}


ANSWERS: list[tuple[str, dict[str, Any], list[dict[str, Any]], str, str | None]] = [
    ("text", whole({"content": "Hello"}), [{"type": "text", "text": "Hello"}], "end_turn", None),
    ("length", whole({"content": "Hel"}, "length"), [{"type": "text", "text": "Hel"}], "max_tokens", None),
    ("stop-sequence", whole({"content": "a"}, "stop", "END"), [{"type": "text", "text": "a"}], "stop_sequence", "END"),
    ("empty-is-one-empty-text", whole({"content": ""}), [{"type": "text", "text": ""}], "end_turn", None),
    ("tool-call", whole({"content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": '{"x": [1, 2]}'}}]}, "tool_calls"),
     [{"type": "tool_use", "id": "call_9", "name": "f", "input": {"x": [1, 2]}}], "tool_use", None),
    ("named-tool-call-finishes-stop", whole({"content": "", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, "stop"),
     [{"type": "tool_use", "id": "call_9", "name": "f", "input": {}}], "tool_use", None),
    ("invalid-arguments-become-empty-input", whole({"content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": '}}]}, "tool_calls"),
     [{"type": "text", "text": "x"}, {"type": "tool_use", "id": "c", "name": "f", "input": {}}], "tool_use", None),
]


@pytest.mark.parametrize(("resp", "content", "reason", "sequence"), [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
def test_whole_answer(resp: dict[str, Any], content: list[dict[str, Any]], reason: str, sequence: str | None) -> None:
    out = chat_to_messages(resp, "claude-x")
    assert out["content"] == content and out["stop_reason"] == reason and out["stop_sequence"] == sequence
    Message.model_validate(out)  # the anthropic SDK's own model, strictly validated
    assert out["id"] == "msg_t1" and out["type"] == "message" and out["role"] == "assistant"
    assert out["model"] == "claude-x"
    assert out["usage"] == {"input_tokens": 4, "cache_read_input_tokens": 6, "cache_creation_input_tokens": 0,
                            "output_tokens": 4}


def test_whole_answer_thinking_first_and_cache_writes() -> None:
    resp = whole({"content": "B", "reasoning": "A"})
    resp["usage"]["prompt_tokens_details"]["created_cache_tokens"] = 3
    out = chat_to_messages(resp, "m")
    assert [b["type"] for b in out["content"]] == ["thinking", "text"] and out["content"][0]["thinking"] == "A"
    assert out["content"][0]["signature"]
    assert out["usage"]["input_tokens"] == 1 and out["usage"]["cache_creation_input_tokens"] == 3
    assert chat_to_messages(whole({"content": "B", "reasoning_content": "A"}), "m")["content"][0]["thinking"] == "A"


def run(chunks: list[dict[str, Any]], estimate: int = 0) -> list[tuple[str, dict[str, Any]]]:
    stream = ChatToMessagesStream("claude-x", input_tokens_estimate=estimate)
    events = [e for c in chunks for e in stream.feed(c)]
    return events + stream.finish()


def check_order(events: list[tuple[str, dict[str, Any]]]) -> None:
    """The anthropic protocol's grammar: one message_start first; blocks 0, 1, 2... each started,
    given deltas and stopped before the next starts; then message_delta, message_stop."""
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names.count("message_start") == 1
    assert names[-2:] == ["message_delta", "message_stop"]
    assert all(d["type"] == n for n, d in events)
    open_index, next_index = None, 0
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index
            open_index, next_index = next_index, next_index + 1
        elif name in ("content_block_delta", "content_block_stop"):
            assert data["index"] == open_index, f"{name} for block {data['index']}, open: {open_index}"
            if name == "content_block_stop":
                open_index = None
        else:
            pytest.fail(f"unexpected {name} between message_start and message_delta")
    assert open_index is None and next_index >= 1


ROLE = chunk({"role": "assistant", "content": ""}, usage=usage(12, 0))
STREAMS: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], str]] = [
    ("text", [ROLE, chunk({"content": "Hel"}), chunk({"content": "lo"}, "stop"), chunk(empty=True, usage=usage(12, 2))],
     [{"type": "text", "text": "Hello"}], "end_turn"),
    ("thinking-then-text", [ROLE, chunk({"reasoning": "hm"}), chunk({"reasoning": "m"}), chunk({"content": "A"}),
                            chunk({"content": "B"}, "length")],
     [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "AB"}], "max_tokens"),
    ("text-then-tool", [ROLE, chunk({"content": "Let me check."}),
                        chunk(tool_delta(0, '{"city"', "call_1", "get_weather")),
                        chunk(tool_delta(0, ': "Oslo"}')), chunk({}, "tool_calls")],
     [{"type": "text", "text": "Let me check."},
      {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}}], "tool_use"),
    ("two-tools", [ROLE, chunk(tool_delta(0, '{"a": 1}', "c0", "f")), chunk(tool_delta(1, "", "c1", "g")),
                   chunk(tool_delta(1, '{"b": 2}'), "tool_calls")],
     [{"type": "tool_use", "id": "c0", "name": "f", "input": {"a": 1}},
      {"type": "tool_use", "id": "c1", "name": "g", "input": {"b": 2}}], "tool_use"),
    ("empty-answer", [ROLE, chunk({}, "stop")], [{"type": "text", "text": ""}], "end_turn"),
    ("stop-sequence", [ROLE, chunk({"content": "x"}, "stop", stop_reason="END")], [{"type": "text", "text": "x"}],
     "stop_sequence"),
]


@pytest.mark.parametrize(("chunks", "content", "reason"), [s[1:] for s in STREAMS], ids=[s[0] for s in STREAMS])
def test_stream_is_accepted_by_the_anthropic_sdk(chunks: list[dict[str, Any]], content: list[dict[str, Any]],
                                                  reason: str) -> None:
    events = run(chunks)
    check_order(events)
    final = anthropic_final(events)
    got = [{k: v for k, v in b.to_dict().items() if k != "signature"} for b in final.content]
    assert got == content and final.stop_reason == reason
    assert final.usage.input_tokens == 12 and final.id == "msg_t1" and final.model == "claude-x"


def test_stream_and_whole_answer_agree() -> None:
    chunks = [ROLE, chunk({"reasoning": "r"}), chunk({"content": "t"}),
              chunk(tool_delta(0, '{"k": "v"}', "c0", "f")), chunk({}, "tool_calls"),
              chunk(empty=True, usage=usage(12, 3, cached=4))]
    streamed = anthropic_final(run(chunks)).to_dict()
    resp = whole({"content": "t", "reasoning": "r", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "f", "arguments": '{"k": "v"}'}}]}, "tool_calls",
        use=usage(12, 3, cached=4))
    assert streamed["content"] == chat_to_messages(resp, "claude-x")["content"]
    assert streamed["usage"] == {**chat_to_messages(resp, "claude-x")["usage"]}


# ---- known failures of other gateways (LiteLLM's /v1/messages adapter, 2025-2026) ------------
def test_no_delta_for_a_block_that_was_not_started() -> None:
    """"Content block not found": a delta whose index was never started makes Claude Code drop
    the stream and retry without streaming. Every delta here names the open block."""
    chunks = [chunk({"content": "a"}), chunk({"reasoning": "b"}), chunk(tool_delta(0, "{}", "c", "f")),
              chunk({"content": "d"}), chunk(tool_delta(1, '{"x":1}', "c2", "g")), chunk({}, "tool_calls")]
    check_order(run(chunks))


def test_tool_input_is_not_lost_after_text() -> None:
    """The call's first chunk carries id, name and the first arguments right after text."""
    chunks = [ROLE, chunk({"content": "ok"}), chunk(tool_delta(0, '{"path": "/tmp', "c", "read")),
              chunk(tool_delta(0, '/a"}')), chunk({}, "tool_calls")]
    final = anthropic_final(run(chunks))
    assert final.content[1].input == {"path": "/tmp/a"}


def test_first_text_delta_after_thinking_is_kept() -> None:
    chunks = [ROLE, chunk({"reasoning": "think"}), chunk({"content": "First"}), chunk({"content": " second"}, "stop")]
    assert anthropic_final(run(chunks)).content[1].text == "First second"


def test_content_in_the_first_chunk_is_kept() -> None:
    """A backend whose first chunk already carries text (no role-only chunk): vLLM's converter
    skips the first chunk's content."""
    assert anthropic_final(run([chunk({"role": "assistant", "content": "Hi"}), chunk({}, "stop")])).content[0].text == "Hi"


def test_one_message_start_even_when_every_chunk_has_usage() -> None:
    chunks = [chunk({"content": str(i)}, usage=usage(7, i)) for i in range(4)] + [chunk({}, "stop", usage(7, 4))]
    events = run(chunks)
    assert [n for n, _ in events].count("message_start") == 1


@pytest.mark.parametrize(("chunks", "estimate", "expected"), [
    ([ROLE, chunk({"content": "x"}, "stop")], 0, 12),
    ([chunk({"role": "assistant", "content": ""}, usage=usage(12, 0, cached=10)), chunk({}, "stop")], 0, 2),
    ([chunk({"content": "x"}), chunk({}, "stop")], 33, 33),
], ids=["from-first-chunk", "cached-left-out", "estimate-without-usage"])
def test_message_start_usage_is_not_all_zeros(chunks: list[dict[str, Any]], estimate: int, expected: int) -> None:
    start = run(chunks, estimate)[0][1]["message"]["usage"]
    assert start["input_tokens"] == expected and start["output_tokens"] == 0


def test_invalid_tool_arguments_stream_as_empty_input() -> None:
    """A cut-off call (max tokens) must not make the SDK's partial-JSON parser raise."""
    events = run([ROLE, chunk(tool_delta(0, '{"a": tru', "c", "f")), chunk(tool_delta(0, "xx"), "length")])
    final = anthropic_final(events)
    assert final.content[0].input == {} and final.stop_reason == "max_tokens"


def test_output_tokens_without_usage_counts_deltas_and_finish_is_idempotent() -> None:
    stream = ChatToMessagesStream("m")
    for c in [chunk({"content": "a"}), chunk({"content": "b"}), chunk({}, "stop")]:
        stream.feed(c)
    events = stream.finish()
    assert events[-2][1]["usage"] == {"output_tokens": 2}
    assert stream.finish() == [] and stream.feed(chunk({"content": "late"})) == []


def test_finish_without_any_chunk_is_a_whole_empty_message() -> None:
    events = ChatToMessagesStream("m", input_tokens_estimate=5).finish()
    check_order(events)
    assert anthropic_final(events).usage.input_tokens == 5
