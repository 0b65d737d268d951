"""Chat answer -> Responses answer, whole (``chat_to_responses``) and streamed
(``ChatToResponsesStream``), checked by the openai SDK's models and its stream accumulator."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response
from sdk_replay import CHAT_ID, chunk, openai_final, tool_delta, usage

from tokenomy.protocols.responses import chat_to_responses
from tokenomy.protocols.responses_stream import ChatToResponsesStream

REQUEST = {"model": "tiny", "input": "hi", "instructions": "Be brief.", "max_output_tokens": 50,
           "metadata": {"k": "v"}}
FN = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}, "strict": False}


def whole(message: dict[str, Any], finish: str = "stop", use: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": CHAT_ID, "object": "chat.completion", "created": 1700000000, "model": "tiny",
            "usage": use or usage(10, 4, cached=6),
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}]}


def shape(output: list[Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for item in output:
        item = item if isinstance(item, dict) else item.to_dict()
        if item["type"] == "message":
            out.append(("message", "".join(c["text"] for c in item["content"])))
        elif item["type"] == "reasoning":
            out.append(("reasoning", item["content"][0]["text"]))
        else:
            out.append(("function_call", (item["call_id"], item["name"], item["arguments"])))
    return out


ANSWERS: list[tuple[str, dict[str, Any], list[tuple[str, Any]], str]] = [
    ("text", whole({"content": "Hello"}), [("message", "Hello")], "completed"),
    ("length-is-incomplete", whole({"content": "Hel"}, "length"), [("message", "Hel")], "incomplete"),
    ("empty", whole({"content": ""}), [("message", "")], "completed"),
    ("reasoning-text-calls", whole({"reasoning": "r", "content": "t", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "oops"}}]}, "tool_calls"),
     [("reasoning", "r"), ("message", "t"), ("function_call", ("c1", "f", '{"a":1}')),
      ("function_call", ("c2", "g", "oops"))], "completed"),
    ("calls-only-no-message", whole({"content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, "tool_calls"),
     [("function_call", ("c1", "f", "{}"))], "completed"),
]


@pytest.mark.parametrize(("resp", "output", "status"), [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
def test_whole_answer_validates_as_an_sdk_response(resp: dict[str, Any], output: list[Any], status: str) -> None:
    out = chat_to_responses(resp, REQUEST)
    parsed = Response.model_validate(out)  # the SDK's own model, strictly validated
    assert shape(out["output"]) == output and out["status"] == status == parsed.status
    assert out["id"] == "resp_t1" and out["object"] == "response" and out["created_at"] == 1700000000
    assert out["instructions"] == "Be brief." and out["max_output_tokens"] == 50 and out["metadata"] == {"k": "v"}
    assert out["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 0},
                            "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 14}
    if status == "incomplete":
        assert out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert parsed.output_text == "".join(t for k, t in output if k == "message")


def run(chunks: list[dict[str, Any]], request: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
    stream = ChatToResponsesStream(request or REQUEST)
    events = [e for c in chunks for e in stream.feed(c)]
    return events + stream.finish()


def check_order(events: list[tuple[str, dict[str, Any]]]) -> None:
    names = [n for n, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(d["type"] == n for n, d in events)
    open_index: int | None = None
    done = 0
    for name, data in events[2:-1]:
        if name == "response.output_item.added":
            assert open_index is None and data["output_index"] == done
            open_index = done
        elif name == "response.output_item.done":
            assert data["output_index"] == open_index
            open_index, done = None, done + 1
        else:
            assert data["output_index"] == open_index, name
    assert open_index is None and done == len(events[-1][1]["response"]["output"])


ROLE = chunk({"role": "assistant", "content": ""}, usage=usage(9, 0))
STREAMS: list[tuple[str, list[dict[str, Any]], list[tuple[str, Any]], str]] = [
    ("text", [ROLE, chunk({"content": "Hel"}), chunk({"content": "lo"}, "stop"), chunk(empty=True, usage=usage(9, 2))],
     [("message", "Hello")], "completed"),
    ("reasoning-text", [ROLE, chunk({"reasoning": "th"}), chunk({"reasoning": "ink"}), chunk({"content": "A"}, "length")],
     [("reasoning", "think"), ("message", "A")], "incomplete"),
    ("text-then-two-calls", [ROLE, chunk({"content": "ok"}), chunk(tool_delta(0, '{"a"', "c1", "f")),
                             chunk(tool_delta(0, ":1}")), chunk(tool_delta(1, "{}", "c2", "f")),
                             chunk({}, "tool_calls")],
     [("message", "ok"), ("function_call", ("c1", "f", '{"a":1}')), ("function_call", ("c2", "f", "{}"))], "completed"),
    ("empty", [ROLE, chunk({}, "stop")], [("message", "")], "completed"),
]


@pytest.mark.parametrize(("chunks", "output", "status"), [s[1:] for s in STREAMS], ids=[s[0] for s in STREAMS])
def test_stream_is_accepted_by_the_openai_sdk(chunks: list[dict[str, Any]], output: list[Any], status: str) -> None:
    events = run(chunks)
    check_order(events)
    final = openai_final(events, tools=[FN])
    assert shape(final.output) == output and final.status == status and final.id == "resp_t1"
    assert final.usage is not None and final.usage.input_tokens == 9


def test_stream_and_whole_answer_agree_to_the_ids() -> None:
    chunks = [ROLE, chunk({"reasoning": "r"}), chunk({"content": "t"}), chunk(tool_delta(0, '{"a":1}', "c1", "f")),
              chunk({}, "tool_calls"), chunk(empty=True, usage=usage(9, 3, cached=2))]
    streamed = run(chunks)[-1][1]["response"]
    resp = whole({"reasoning": "r", "content": "t", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]}, "tool_calls",
        use=usage(9, 3, cached=2))
    assert streamed["output"] == chat_to_responses(resp, REQUEST)["output"]
    assert streamed["usage"] == chat_to_responses(resp, REQUEST)["usage"]


def test_deltas_carry_the_open_item_and_text_events_match() -> None:
    events = run([ROLE, chunk({"content": "a"}), chunk({"content": "b"}, "stop")])
    by = {n: d for n, d in events}
    assert by["response.output_text.done"]["text"] == "ab"
    assert by["response.content_part.done"]["part"]["text"] == "ab"
    item_id = by["response.output_item.added"]["item"]["id"]
    assert all(d.get("item_id", item_id) == item_id for _, d in events[2:-1])
    assert json.loads(json.dumps(events))  # plain JSON throughout


def test_created_event_echoes_the_request_and_has_no_usage() -> None:
    created = run([ROLE])[0][1]["response"]
    assert created["status"] == "in_progress" and created["usage"] is None and created["output"] == []
    Response.model_validate(created)


def test_usage_fallback_and_idempotent_finish() -> None:
    stream = ChatToResponsesStream(REQUEST, input_tokens_estimate=7)
    for c in [chunk({"content": "a"}), chunk({"content": "b"}, "stop")]:
        stream.feed(c)
    done = stream.finish()[-1][1]["response"]["usage"]
    assert (done["input_tokens"], done["output_tokens"]) == (7, 2)
    assert stream.finish() == [] and stream.feed(chunk({"content": "x"})) == []
