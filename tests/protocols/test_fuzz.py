"""Any JSON a client or a backend sends: the translations raise ProtocolError or answer, nothing else."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenomy.protocols import ProtocolError
from tokenomy.protocols.messages import (
    ChatToMessagesStream,
    chat_to_messages,
    count_tokens_body,
    messages_to_chat,
)
from tokenomy.protocols.responses import chat_to_responses, responses_to_chat
from tokenomy.protocols.responses_stream import ChatToResponsesStream
from tokenomy.protocols.sse import format_events

KEYS = ["model", "max_tokens", "messages", "system", "role", "content", "type", "text", "tools", "tool_choice",
        "name", "input", "input_schema", "id", "tool_use_id", "source", "stop_sequences", "stream", "call_id",
        "arguments", "output", "instructions", "max_output_tokens", "parameters", "summary", "choices", "delta",
        "tool_calls", "function", "index", "finish_reason", "usage", "prompt_tokens", "reasoning", "message"]
VALUES = ["user", "assistant", "system", "text", "image", "tool_use", "tool_result", "thinking", "message",
          "function_call", "function_call_output", "reasoning", "function", "any", "tool", "auto", "required",
          "input_text", "stop", "length", "tool_calls", "base64", "url"]

leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.just(10**30), st.floats(allow_nan=False), st.sampled_from(VALUES),
                 st.text(max_size=8))
json_values = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=6)), max_leaves=30)
bodies = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=8)


def _translate(fn: Any, body: Any) -> None:
    try:
        fn(body)
    except ProtocolError as err:
        assert err.message and err.status in (400, 404)


@settings(max_examples=150, deadline=None)
@given(bodies)
def test_requests_raise_only_protocol_errors(body: dict[str, Any]) -> None:
    for fn in (messages_to_chat, responses_to_chat, count_tokens_body):
        _translate(fn, body)


@settings(max_examples=100, deadline=None)
@given(bodies, st.lists(bodies, max_size=6))
def test_answers_and_streams_take_any_chat_json(resp: dict[str, Any], chunks: list[dict[str, Any]]) -> None:
    assert chat_to_messages(resp, "m")["content"]
    assert chat_to_responses(resp, {})["output"]
    for stream in (ChatToMessagesStream("m"), ChatToResponsesStream({})):
        events = [e for c in chunks for e in stream.feed(c)] + stream.finish()  # type: ignore[attr-defined]
        assert events and all(isinstance(name, str) and data["type"] == name for name, data in events)
        assert format_events(events).count(b"\n\n") == len(events)
