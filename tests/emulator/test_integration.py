"""The real server on loopback: the openai SDK, mid-stream disconnect, PD over HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from helpers.launch import emulator, emulators
from tokenomy.perf import PerfModel

from .conftest import metric

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with emulator("--served-model-name", "tiny-test") as u:
        yield u


def test_openai_sdk_completions_and_chat(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    assert [m.id for m in client.models.list()] == ["tiny-test"]
    c = client.completions.create(model="tiny-test", prompt="Say something.", max_tokens=7,
                                  extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 7 and c.choices[0].finish_reason == "length" and c.choices[0].text
    assert c.usage.prompt_tokens_details.cached_tokens == 0
    chat = client.chat.completions.create(model="tiny-test", messages=[{"role": "user", "content": "Hi!"}],
                                          max_tokens=5, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 5

    stream = client.completions.create(model="tiny-test", prompt="Say something.", max_tokens=7, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.choices[0].text
    assert chunks[-1].usage.completion_tokens == 7 and chunks[-1].usage.prompt_tokens == c.usage.prompt_tokens
    # On the wall clock each modelled step is its own chunk, as vLLM streams.
    assert len([ch for ch in chunks if ch.choices]) == 7

    cstream = client.chat.completions.create(model="tiny-test", messages=[{"role": "user", "content": "Hi!"}],
                                             max_tokens=5, stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    cchunks = list(cstream)
    text = "".join(ch.choices[0].delta.content or "" for ch in cchunks if ch.choices)
    assert text == chat.choices[0].message.content and cchunks[-1].usage.completion_tokens == 5

    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny-test", prompt="x", max_tokens=10**6)


def test_mid_stream_disconnect_frees_the_kv(url: str) -> None:
    body = {"prompt": "long answer please " * 50, "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            got = 0
            for line in lines:
                got += line.startswith("data: ")
                if got == 5:
                    break
            m = client.get(url + "/metrics").text
            assert metric(m, "vllm:num_requests_running") == 1 and metric(m, "vllm:kv_cache_usage_perc") > 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            m = client.get(url + "/metrics").text
            if metric(m, "vllm:num_requests_running") == 0:
                break
            time.sleep(0.05)
        assert metric(m, "vllm:num_requests_running") == 0
        assert metric(m, "vllm:kv_cache_usage_perc") == 0
        assert metric(m, "vllm:generation_tokens_total") < 500  # stopped long before 3000 tokens
        ok = client.post(url + "/v1/completions", json={"prompt": "next", "max_tokens": 2})
        assert ok.status_code == 200


def _first_token_s(client: httpx.Client, endpoint: str, body: dict) -> tuple[float, str]:
    t0 = time.monotonic()
    first = None
    text = []
    with client.stream("POST", endpoint, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    first = first if first is not None else time.monotonic() - t0
                    text.append(chunk["choices"][0]["text"])
    assert first is not None
    return first, "".join(text)


def test_pd_over_http_matches_mixed_and_pays_the_transfer(url: str) -> None:
    link_gbps = 1.0
    mixed = url
    roles = [["--role", "prefill"], ["--role", "decode", "--link-gbps", str(link_gbps)]]
    with emulators(*roles) as (prefill, decode), httpx.Client(timeout=30) as c:
        body = {"prompt": "Summarise this document. " + "The quick brown fox jumps. " * 300,
                "max_tokens": 24, "ignore_eos": True}
        _, mixed_text = _first_token_s(c, mixed + "/v1/completions", body)

        # The proxy's two calls (vLLM's NixlConnector protocol).
        t0 = time.monotonic()
        p = c.post(prefill + "/v1/completions", json={**body, "max_tokens": 1,
                                                      "kv_transfer_params": {"do_remote_decode": True}}).json()
        prefill_s = time.monotonic() - t0
        params = p["kv_transfer_params"]
        assert params["do_remote_prefill"] and params["remote_request_id"]
        decode_ttft_s, pd_text = _first_token_s(c, decode + "/v1/completions", {**body, "kv_transfer_params": params})
        assert pd_text == mixed_text
        # the decode side reports the prefill side's cache hits as cached_tokens (vLLM's NixlConnector:
        # kv_transfer_params.remote_prefill_cached_tokens), not the KV it pulled
        assert params["remote_prefill_cached_tokens"] == p["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        again = c.post(decode + "/v1/completions", json={**body, "kv_transfer_params": {
            **params, "remote_request_id": "gone", "remote_prefill_cached_tokens": 640}}).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 640

        n_prompt = p["usage"]["prompt_tokens"]
        transfer_s = PerfModel.from_names("llama-3.1-8b", "h100").kv_transfer_time_s(n_prompt - 1, link_gbps * 1e9)
        assert transfer_s > 0.1  # large enough to see on the wall clock
        assert decode_ttft_s >= transfer_s
        assert prefill_s + decode_ttft_s >= transfer_s + PerfModel.from_names("llama-3.1-8b", "h100").prefill_time_s(
            n_prompt)
        # The decode side pulled the KV, so the prefill side unpinned it.
        m = c.get(prefill + "/metrics").text
        assert metric(m, "vllm:kv_cache_usage_perc") == 0
