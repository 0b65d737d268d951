"""Reading Anthropic Messages and OpenAI Responses streams and error answers: the same times, text and
usage as a chat stream gives; refusals in each protocol's shape are retried as chat's are."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tokenomy.bench import run_bench
from tokenomy.bench.sse import (
    MessagesStreamState,
    ResponsesStreamState,
    StreamError,
    parse_usage,
    stream_state,
)
from tokenomy.policy.closedloop import RetryPolicy
from tokenomy.protocols.sse import anthropic_error_body, anthropic_error_event, format_event

from .factories import agent_sessions, config
from .fakes import FakeClock


def _feed(state: Any, raw: bytes, now_s: float) -> None:
    for line in raw.decode().splitlines():
        state.feed_line(line, now_s)


def _delta(kind: str, key: str, value: str) -> bytes:
    return format_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": kind, key: value}})


def test_messages_deltas_of_thinking_text_and_tool_input_are_tokens_and_usage_sums_cache_reads() -> None:
    s = stream_state("messages")
    assert isinstance(s, MessagesStreamState)
    usage = {"input_tokens": 10, "cache_read_input_tokens": 64, "cache_creation_input_tokens": 6, "output_tokens": 1}
    _feed(s, format_event("message_start", {"type": "message_start", "message": {"usage": usage}}), 1.0)
    _feed(s, format_event("ping", {"type": "ping"}), 1.1)
    _feed(s, _delta("thinking_delta", "thinking", "hm"), 2.0)
    _feed(s, _delta("signature_delta", "signature", "sig"), 2.1)  # not generated text
    _feed(s, _delta("text_delta", "text", " hi"), 3.0)
    _feed(s, _delta("input_json_delta", "partial_json", '{"q": 1}'), 4.0)
    assert s.usage is None  # message_start's output_tokens is a placeholder
    _feed(s, format_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                                            "usage": {"output_tokens": 3}}), 5.0)
    _feed(s, format_event("message_stop", {"type": "message_stop"}), 5.1)
    assert s.token_times_s == [2.0, 3.0, 4.0] and s.text == 'hm hi{"q": 1}'
    assert s.finish_reason == "max_tokens" and s.done
    assert parse_usage(s.usage) == (80, 3, 64)


def test_a_messages_error_event_raises_with_the_status_of_its_type() -> None:
    with pytest.raises(StreamError) as exc:
        _feed(stream_state("messages"), anthropic_error_event(529, "busy"), 0.0)
    assert exc.value.status == "529" and str(exc.value) == "busy"


def test_responses_deltas_are_tokens_and_usage_comes_from_the_final_response() -> None:
    s = stream_state("responses")
    assert isinstance(s, ResponsesStreamState)
    _feed(s, format_event("response.created", {"type": "response.created", "response": {"usage": None}}), 1.0)
    for t, (kind, delta) in enumerate([("reasoning_text", "hm"), ("output_text", " hi"),
                                       ("function_call_arguments", "{}")], start=2):
        _feed(s, format_event(f"response.{kind}.delta", {"type": f"response.{kind}.delta", "delta": delta}), float(t))
    usage = {"input_tokens": 80, "input_tokens_details": {"cached_tokens": 64}, "output_tokens": 3}
    _feed(s, format_event("response.completed", {"type": "response.completed",
                                                 "response": {"status": "incomplete", "usage": usage}}), 5.0)
    assert s.token_times_s == [2.0, 3.0, 4.0] and s.text == "hm hi{}"
    assert s.finish_reason == "incomplete" and s.done
    assert parse_usage(s.usage) == (80, 3, 64)


@pytest.mark.parametrize("event", [
    {"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "sequence_number": 3},
    {"type": "response.failed", "response": {"error": {"code": "rate_limit_exceeded", "message": "slow down"}}},
])
def test_a_responses_error_event_or_failed_response_raises_with_its_code(event: dict[str, Any]) -> None:
    with pytest.raises(StreamError) as exc:
        _feed(stream_state("responses"), format_event(event["type"], event), 0.0)
    assert exc.value.status == "rate_limit_exceeded" and str(exc.value) == "slow down"


class _Scripted:
    """An opener answering each request with the next ``(status, headers, body bytes)``."""

    def __init__(self, answers: list[tuple[int, dict[str, str], bytes]]) -> None:
        self.answers = answers
        self.bodies: list[dict[str, Any]] = []

    @asynccontextmanager
    async def __call__(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> AsyncIterator[Any]:
        self.bodies.append(body)
        status, hdrs, raw = self.answers.pop(0)

        class Resp:
            def __init__(self) -> None:
                self.status, self.headers = status, hdrs

            async def read(self) -> bytes:
                return raw

            async def lines(self) -> AsyncIterator[bytes]:
                for line in raw.splitlines(keepends=True):
                    yield line

        yield Resp()


def _messages_answer(n_out: int) -> bytes:
    usage = {"input_tokens": 5, "cache_read_input_tokens": 0, "output_tokens": 1}
    return b"".join([
        format_event("message_start", {"type": "message_start", "message": {"usage": usage}}),
        *(_delta("text_delta", "text", f" w{i}") for i in range(n_out)),
        format_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                                       "usage": {"output_tokens": n_out}}),
        format_event("message_stop", {"type": "message_stop"}),
    ])


def test_an_overloaded_529_is_retried_after_its_retry_after_and_its_message_is_read() -> None:
    clock = FakeClock()
    overloaded = json.dumps(anthropic_error_body(529, "Overloaded")).encode()
    opener = _Scripted([(529, {"retry-after": "3"}, overloaded), (200, {}, _messages_answer(8))])
    rep = run_bench(agent_sessions(1, turns=1, out=8), config(api="messages"), clock=clock, opener=opener)
    assert len(opener.bodies) == 2 and opener.bodies[0] == opener.bodies[1]
    assert 3.0 in clock.sleeps
    assert rep.summary.finished == 1 and rep.errors_by_status == {"529": 1} and rep.extras["retries"] == 1
    assert rep.records[0].output_tokens == 8 and rep.records[0].prompt_tokens == 5


def test_a_529_past_its_retries_abandons_the_session() -> None:
    clock = FakeClock()
    overloaded = json.dumps(anthropic_error_body(529, "Overloaded")).encode()
    opener = _Scripted([(529, {}, overloaded)])
    rep = run_bench(agent_sessions(1, turns=2, out=8), config(api="messages", retry=RetryPolicy(max_retries=0)),
                    clock=clock, opener=opener)
    assert len(opener.bodies) == 1 and rep.extras["abandoned_turns"] == 1
