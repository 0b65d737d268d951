"""Parsing OpenAI event streams."""

from __future__ import annotations

import json

import pytest

from tokenomy.bench.sse import StreamError, StreamState, parse_usage


def _line(obj: object) -> str:
    return "data: " + json.dumps(obj)


def test_role_only_and_usage_chunks_are_not_tokens() -> None:
    s = StreamState()
    s.feed_line(_line({"choices": [{"delta": {"role": "assistant", "content": ""}}]}), 1.0)
    s.feed_line(_line({"choices": [{"delta": {"content": " hi"}}]}), 2.0)
    s.feed_line("", 2.1)
    s.feed_line(": keep-alive comment", 2.2)
    s.feed_line(_line({"choices": [{"delta": {"content": " there"}, "finish_reason": "length"}]}), 3.0)
    s.feed_line(_line({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}), 3.5)
    s.feed_line("data: [DONE]", 3.6)
    assert s.token_times_s == [2.0, 3.0]
    assert s.text == " hi there" and s.finish_reason == "length" and s.done
    assert parse_usage(s.usage) == (9, 2, 0)


def test_completions_text_chunks_count() -> None:
    s = StreamState()
    s.feed_line(_line({"choices": [{"text": " a"}]}), 1.0)
    s.feed_line(_line({"choices": [{"text": ""}]}), 1.5)
    assert s.token_times_s == [1.0]


def test_error_payload_raises_with_its_code() -> None:
    with pytest.raises(StreamError) as exc:
        StreamState().feed_line(_line({"error": {"message": "boom", "code": 503}}), 0.0)
    assert exc.value.status == "503"


def test_non_json_data_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        StreamState().feed_line("data: {oops", 0.0)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}, (100, 5, 64)),
        ({"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": None}, (10, 5, 0)),
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}}, (10, 0, 10)),
        ({"completion_tokens": 5}, None),
        (None, None),
    ],
)
def test_parse_usage(usage: dict | None, expected: tuple[int, int, int] | None) -> None:
    assert parse_usage(usage) == expected
