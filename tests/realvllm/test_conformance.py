"""The emulator against real vLLM: one set of protocol tests, run on both.

Each test asserts what a client (the OpenAI SDK, ``tokenomy bench``) or our gateway reads: the
fields and types of completions and chat answers, the order of stream chunks and where usage
comes, the status and error JSON of bad input, the ``/metrics`` names and types the gateway and
the views scrape, and the fields of a P/D hand-off. Both targets serve the tiny model's tokenizer
under the same name, so token counts of completions prompts agree too. What still differs is
listed in docs/emulator.md, with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from realvllm_support import MODEL

from helpers.launch import emulator

pytestmark = pytest.mark.integration

PROMPT = "Hello there, the model answers the question."
METRIC_TYPES = {
    # read by the gateway's routers (tokenomy.gateway.backends)
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    # read by metering checks, bench and the views
    "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter", "vllm:prompt_tokens_cached_total": "counter",
    "vllm:prefix_cache_queries_total": "counter", "vllm:prefix_cache_hits_total": "counter",
    "vllm:request_success_total": "counter", "vllm:num_preemptions_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram", "vllm:request_generation_tokens": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
}
"""Metric families (as ``# TYPE`` names them) every target must expose, with their type."""


@pytest.fixture(scope="module")
def emulator_url(tiny_model: Path) -> Iterator[str]:
    """Our emulator with the tiny model's tokenizer, vLLM CPU's block size and context."""
    with emulator("--host", "127.0.0.1", "--served-model-name", MODEL, "--tokenizer", str(tiny_model / "tokenizer.json"),
                  "--block-size", "128", "--max-model-len", "4096", "--time-scale", "0.05") as url:
        yield url


@pytest.fixture(params=["emulator", "vllm"])
def target(request: pytest.FixtureRequest) -> str:
    """Base URL of the target under test (vLLM: the shared ``decode-1`` instance)."""
    if request.param == "emulator":
        return str(request.getfixturevalue("emulator_url"))
    return str(request.getfixturevalue("vllm_urls")["decode-1"])


def _post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def _events(resp: httpx.Response) -> list[Any]:
    """The SSE ``data:`` payloads of a stream, ``[DONE]`` as the string."""
    out: list[Any] = []
    for line in resp.text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return out


def _usage_ok(usage: dict[str, Any], completion_tokens: int) -> None:
    assert usage["completion_tokens"] == completion_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + completion_tokens
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)


def test_completion_answer_shape(target: str, tiny_model: Path) -> None:
    from tokenizers import Tokenizer

    r = _post(target, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 5, "ignore_eos": True,
                                           "temperature": 0})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    d = r.json()
    assert d["object"] == "text_completion" and d["model"] == MODEL
    assert d["id"].startswith("cmpl-") and isinstance(d["created"], int)
    (choice,) = d["choices"]
    assert choice["index"] == 0 and isinstance(choice["text"], str) and choice["finish_reason"] == "length"
    _usage_ok(d["usage"], 5)
    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    assert d["usage"]["prompt_tokens"] == len(tok.encode(PROMPT).ids)  # the same tokenizer counts alike


def test_chat_answer_shape(target: str) -> None:
    r = _post(target, "/v1/chat/completions", {"model": MODEL, "max_tokens": 4, "ignore_eos": True,
                                                "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200
    d = r.json()
    assert d["object"] == "chat.completion" and d["model"] == MODEL and d["id"].startswith("chatcmpl-")
    (choice,) = d["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    _usage_ok(d["usage"], 4)


def test_chat_stream_chunk_order_and_usage(target: str) -> None:
    r = _post(target, "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 4, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"  # the role comes first
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []  # usage last, in a chunk of its own
    _usage_ok(usage_chunk["usage"], 4)
    body = chunks[:-1]
    finishes = [c["choices"][0]["finish_reason"] for c in body]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert all(c.get("usage") is None for c in body)
    assert sum(1 for c in body if c["choices"][0]["delta"].get("content")) >= 1


def test_completion_stream_without_usage(target: str) -> None:
    r = _post(target, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "ignore_eos": True,
                                           "stream": True})
    events = _events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" and c.get("usage") is None for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(isinstance(c["choices"][0]["text"], str) for c in chunks)


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "no-such-model", "prompt": "hi", "max_tokens": 2}, 404, "model"),
    ({"model": MODEL, "max_tokens": 2}, 400, "prompt"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 5000}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "temperature": "hot"}, 400, None),
    ({"model": MODEL, "prompt": " the" * 4100, "max_tokens": 2}, 400, None),
], ids=["unknown-model", "no-prompt", "negative-max-tokens", "max-tokens-over-context", "bad-type",
        "prompt-over-context"])
def test_bad_completions_get_error_json(target: str, body: dict[str, Any], status: int, param: str | None) -> None:
    r = _post(target, "/v1/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"] and err["code"] == status
    if param is not None:
        assert err["param"] == param


def test_bad_json_and_bad_chat_messages_get_400(target: str) -> None:
    r = httpx.post(target + "/v1/chat/completions", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = _post(target, "/v1/chat/completions", {"model": MODEL, "messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400


def test_models_list(target: str) -> None:
    d = httpx.get(target + "/v1/models", timeout=10).json()
    assert d["object"] == "list" and [m["id"] for m in d["data"]] == [MODEL]
    assert d["data"][0]["object"] == "model" and d["data"][0]["max_model_len"] == 4096


def _types(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            out[name] = kind
    return out


def test_metrics_names_and_types(target: str) -> None:
    _post(target, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "ignore_eos": True})
    r = httpx.get(target + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    types = _types(r.text)
    wrong = {n: (types.get(n), t) for n, t in METRIC_TYPES.items() if types.get(n) != t}
    assert not wrong, f"(exposed, expected) type per name: {wrong}"
    assert any(line.startswith("vllm:generation_tokens_total{") for line in r.text.splitlines())


def test_prefill_hand_off_fields(target: str) -> None:
    """A P/D prefill request (``do_remote_decode``) answers with what a decode instance needs."""
    params = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}
    r = _post(target, "/v1/completions", {"model": MODEL, "prompt": PROMPT * 30, "max_tokens": 1,
                                           "kv_transfer_params": params})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["usage"]["completion_tokens"] == 1
    kv = d["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert isinstance(kv["remote_engine_id"], str) and isinstance(kv["remote_request_id"], str)
    assert isinstance(kv["remote_block_ids"], list) and kv["remote_block_ids"]
    assert isinstance(kv["remote_host"], str) and isinstance(kv["remote_port"], int)
    # what the decode side reports as cached_tokens: the prefill side's cache hits
    assert kv["remote_prefill_cached_tokens"] == d["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert kv["remote_num_tokens"] == d["usage"]["prompt_tokens"]


# ---- the agent protocols: Anthropic Messages and OpenAI Responses -----------------------------
def _named_events(resp: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a stream whose every event is named, as both protocols name them."""
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream"), resp.text
    out = []
    for block in resp.text.strip().split("\n\n"):
        (event, data) = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: "), block
        out.append((event[len("event: "):], json.loads(data[len("data: "):])))
    assert all(d["type"] == name for name, d in out)
    return out


MSG = {"model": MODEL, "max_tokens": 5, "system": "Be brief.", "messages": [{"role": "user", "content": PROMPT}]}


def test_messages_answer_shape_and_usage_adds_up_to_count_tokens(target: str) -> None:
    r = _post(target, "/v1/messages", MSG)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), r.text
    d = r.json()
    assert d["type"] == "message" and d["role"] == "assistant" and d["model"] == MODEL and isinstance(d["id"], str)
    assert [b["type"] for b in d["content"]] == ["text"] and isinstance(d["content"][0]["text"], str)
    u = d["usage"]
    assert 1 <= u["output_tokens"] <= 5 and (d["stop_reason"] == "max_tokens") == (u["output_tokens"] == 5)
    assert d["stop_reason"] in ("max_tokens", "end_turn")
    count = _post(target, "/v1/messages/count_tokens", {k: v for k, v in MSG.items() if k != "max_tokens"}).json()
    prompt = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
    assert count == {"input_tokens": prompt, "context_management": {"original_input_tokens": prompt}}


def test_messages_stream_event_order(target: str) -> None:
    events = _named_events(_post(target, "/v1/messages", {**MSG, "stream": True}))
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names.count("message_start") == 1
    assert names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["role"] == "assistant" and start["usage"]["input_tokens"] > 0
    middle = names[1:-2]  # one text block (vLLM sends none if every token decodes to "")
    if middle:
        assert middle[0] == "content_block_start" and middle[-1] == "content_block_stop"
        assert set(middle[1:-1]) <= {"content_block_delta"} and all(d["index"] == 0 for _, d in events[1:-2])
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] in ("max_tokens", "end_turn") and 1 <= delta["usage"]["output_tokens"] <= 5
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert isinstance(text, str)


@pytest.mark.parametrize(("body", "status", "shape"), [
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, 400, "openai"),
    ({**MSG, "messages": "hi"}, 400, "openai"),
    ({**MSG, "model": "no-such-model"}, 404, "anthropic"),
    ({**MSG, "messages": [{"role": "user", "content": " the" * 4100}]}, 400, "anthropic"),
], ids=["no-max-tokens", "messages-not-a-list", "unknown-model", "prompt-over-context"])
def test_bad_messages_get_vllms_error_shapes(target: str, body: dict[str, Any], status: int, shape: str) -> None:
    """vLLM validates the body before its Anthropic handler runs: those errors are OpenAI-shaped;
    what the handler finds is Anthropic-shaped."""
    r = _post(target, "/v1/messages", body)
    assert r.status_code == status, r.text
    d = r.json()
    if shape == "anthropic":
        assert d["type"] == "error" and set(d["error"]) == {"type", "message"} and d["error"]["message"]
    else:
        assert set(d["error"]) >= {"message", "type", "param", "code"} and d["error"]["code"] == status


def test_tools_on_messages(target: str, request: pytest.FixtureRequest) -> None:
    """The shared vLLM instances run without ``--tool-call-parser``: vLLM refuses any request with
    tools. The emulator serves tools as vLLM with a tool parser does (docs/emulator.md)."""
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"enum": ["Oslo"]}},
                                                    "required": ["city"]}}
    r = _post(target, "/v1/messages", {**MSG, "max_tokens": 64, "tools": [tool],
                                       "tool_choice": {"type": "tool", "name": "get_weather"}})
    if request.node.callspec.params["target"] == "emulator":
        assert r.status_code == 200, r.text
        d = r.json()
        assert d["content"][0]["type"] == "tool_use" and d["content"][0]["input"] == {"city": "Oslo"}
        assert d["stop_reason"] == "tool_use"
    else:
        assert r.status_code == 400 and "tool-call-parser" in r.json()["error"]["message"]


RESP = {"model": MODEL, "input": PROMPT, "instructions": "Be brief.", "max_output_tokens": 5}


def _responses_usage_ok(u: dict[str, Any]) -> None:
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"] and 1 <= u["output_tokens"] <= 5
    assert isinstance(u["input_tokens_details"]["cached_tokens"], int)
    assert isinstance(u["input_tokens_details"]["cache_write_tokens"], int)
    assert u["output_tokens_details"]["reasoning_tokens"] == 0


def test_responses_answer_shape(target: str) -> None:
    r = _post(target, "/v1/responses", RESP)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["object"] == "response" and d["id"].startswith("resp_") and d["model"] == MODEL
    assert d["instructions"] == "Be brief." and d["max_output_tokens"] == 5 and d["tools"] == []
    assert d["status"] in ("completed", "incomplete")
    if d["status"] == "incomplete":
        assert d["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = d["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert all(c["type"] == "output_text" for c in item["content"])
    _responses_usage_ok(d["usage"])


def test_responses_stream_event_order(target: str) -> None:
    events = _named_events(_post(target, "/v1/responses", {**RESP, "stream": True}))
    names = [n for n, _ in events]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    deltas = names.count("response.output_text.delta")
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * deltas,
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]
    created, done = events[0][1]["response"], events[-1][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    assert created["id"] == done["id"] and done["status"] in ("completed", "incomplete")
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert events[-4][1]["text"] == text and [c["text"] for c in done["output"][0]["content"]] in ([text], [])
    _responses_usage_ok(done["usage"])


@pytest.mark.parametrize(("body", "status"), [({"model": MODEL, "input": 3}, 400),
                                              ({**RESP, "previous_response_id": "resp_nope"}, 404),
                                              ({**RESP, "model": "no-such-model"}, 404),
                                              ({**RESP, "input": " the" * 4100}, 400)],
                         ids=["bad-input", "unknown-previous-response", "unknown-model", "prompt-over-context"])
def test_bad_responses_get_error_json(target: str, body: dict[str, Any], status: int) -> None:
    r = _post(target, "/v1/responses", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["code"] == status and err["message"]


def test_chat_stream_with_continuous_usage(target: str) -> None:
    r = _post(target, "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 4, "ignore_eos": True, "stream": True, "messages": [{"role": "user", "content": PROMPT}],
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    chunks = _events(r)[:-1]
    assert all(isinstance(c.get("usage"), dict) for c in chunks)
    assert chunks[0]["usage"]["completion_tokens"] == 0 and chunks[-1]["choices"] == []
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 4
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {chunks[0]["usage"]["prompt_tokens"]}
    _usage_ok(chunks[-1]["usage"], 4)
