"""Event framing and the error events that end a cut stream: each SDK raises its typed error."""

from __future__ import annotations

import anthropic
import openai
import pytest
from sdk_replay import anthropic_client, chunk, openai_client, usage

from tokenomy.protocols.messages import ChatToMessagesStream
from tokenomy.protocols.responses_stream import ChatToResponsesStream
from tokenomy.protocols.sse import (
    anthropic_error_body,
    anthropic_error_event,
    anthropic_error_type,
    format_event,
    format_events,
    openai_error_body,
    responses_error_event,
)


def test_format_event_names_every_event() -> None:
    assert format_event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert format_events([("a", {}), ("b", {"x": "é"})]) == b'event: a\ndata: {}\n\nevent: b\ndata: {"x":"\xc3\xa9"}\n\n'


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (401, "authentication_error"),
                                              (404, "not_found_error"), (429, "rate_limit_error"),
                                              (500, "api_error"), (529, "overloaded_error"), (502, "api_error"),
                                              (418, "invalid_request_error")])
def test_anthropic_error_types(status: int, kind: str) -> None:
    assert anthropic_error_type(status) == kind
    assert anthropic_error_body(status, "m") == {"type": "error", "error": {"type": kind, "message": "m"}}


def test_openai_error_body() -> None:
    assert openai_error_body(429, "slow down", code="rate_limit_exceeded") == {"error": {
        "message": "slow down", "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}}
    assert openai_error_body(503, "x")["error"]["type"] == "server_error"


def test_a_cut_anthropic_stream_raises_the_sdk_status_error() -> None:
    stream = ChatToMessagesStream("tiny")
    head = format_events(stream.feed(chunk({"role": "assistant", "content": "par"}, usage=usage(5, 1))))
    body = head + anthropic_error_event(529, "backend went away")
    client = anthropic_client(body)
    with pytest.raises(anthropic.APIStatusError) as err, \
            client.messages.stream(model="tiny", max_tokens=8, messages=[{"role": "user", "content": "x"}]) as s:
        s.get_final_message()
    assert "backend went away" in str(err.value)
    assert err.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "backend went away"}}


def test_a_cut_responses_stream_raises_the_sdk_api_error() -> None:
    stream = ChatToResponsesStream({"model": "tiny", "input": "x"})
    head = format_events(stream.feed(chunk({"role": "assistant", "content": "par"}, usage=usage(5, 1))))
    body = head + responses_error_event(502, "backend went away", stream.sequence_number)
    client = openai_client(body)
    with pytest.raises(openai.APIError) as err, client.responses.stream(model="tiny", input="x") as s:
        s.get_final_response()
    assert err.value.message == "backend went away"


def test_responses_error_event_is_also_a_responses_error_event() -> None:
    data = responses_error_event(500, "boom", 7).split(b"data: ", 1)[1]
    from openai.types.responses import ResponseErrorEvent

    event = ResponseErrorEvent.model_validate_json(data)
    assert (event.type, event.message, event.sequence_number) == ("error", "boom", 7)
