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
