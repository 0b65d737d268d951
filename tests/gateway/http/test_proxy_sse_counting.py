"""The SSE relay's framing and token counting, without servers: what a split read or a
multi-token chunk does to what the client gets and what the caps count."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenomy.gateway.http.chat_adapter import ChatReader
from tokenomy.gateway.http.streaming import SseFramer


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\r\n\r\n"


def test_a_crlf_split_across_two_reads_still_ends_an_event() -> None:
    """A backend writing CRLF line ends (an SSE server may) can have "\\r" end one read and "\\n"
    start the next; the event must come out whole, once, with "\\n" line ends."""
    stream = b"".join(_event({"i": i}) for i in range(3)) + b"data: [DONE]\r\n\r\n"
    whole = SseFramer().feed(stream)
    assert [e.startswith(b"data: ") and e.endswith(b"\n\n") and b"\r" not in e for e in whole] == [True] * 4
    for cut in range(1, len(stream)):  # every place a read can end, "\r|\n" included
        framer = SseFramer()
        assert framer.feed(stream[:cut]) + framer.feed(stream[cut:]) == whole, cut
    framer = SseFramer()
    assert [e for b in stream for e in framer.feed(bytes([b]))] == whole  # one byte a read


def _chunk(**choice: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    obj = {"choices": [{"index": 0, **choice}]}
    return obj, obj["choices"]


@pytest.mark.parametrize(("choice", "tokens"), [
    ({"delta": {"content": "Hi"}}, 1),  # one short token
    ({"delta": {"content": " the quick brown fox jumps over"}}, 7),  # several tokens in one chunk (~4 chars each)
    ({"delta": {"content": "ab"}, "logprobs": {"content": [{"token": "a"}, {"token": "b"}]}}, 2),
    ({"text": "xyz", "logprobs": {"tokens": ["x", "y", "z"], "token_logprobs": [0, 0, 0]}}, 3),
    ({"delta": {"content": "abc"}, "token_ids": [5, 6, 7, 8]}, 4),
    ({"delta": {"reasoning_content": "let me think about this"}}, 5),
    ({"delta": {}}, 0),
])
def test_tokens_per_chunk_are_counted_not_assumed_one(choice: dict[str, Any], tokens: int) -> None:
    obj, _ = _chunk(**choice)
    reader = ChatReader(client_wants_usage=False)
    assert reader.feed(None, obj, b"e")[0] == tokens and reader.seen == tokens


def test_cumulative_usage_in_chunks_is_exact() -> None:
    """vLLM's continuous_usage_stats puts the running completion_tokens in every chunk: the new
    tokens of a chunk are its growth, whatever the text looks like."""
    reader = ChatReader(client_wants_usage=True)
    counted = []
    for total in (3, 3, 10, 11):
        obj = {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"completion_tokens": total}}
        counted.append(reader.feed(None, obj, b"e")[0])
    assert counted == [3, 0, 7, 1] and reader.seen == 11


def test_n_choices_in_one_chunk_each_count() -> None:
    obj = {"choices": [{"index": i, "delta": {"content": "word"}} for i in range(4)]}
    assert ChatReader(client_wants_usage=False).feed(None, obj, b"e")[0] == 4
