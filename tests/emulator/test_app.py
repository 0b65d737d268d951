"""The HTTP API in-process: formats, usage, prefix caching seen from outside, bad input, PD params."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tokenomy.emulator import EmulatorConfig, build_app
from tokenomy.emulator.tokenizer import WordTokenizer

from .conftest import FAST, metric

TOK = WordTokenizer()


def sse_events(text: str) -> list[dict | str]:
    out: list[dict | str] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_completion_usage_and_text(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "Hello there, emulator.", "max_tokens": 25,
                                             "ignore_eos": True})
    assert r.status_code == 200
    body = r.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 25 == len(TOK.encode(choice["text"]))
    assert body["usage"]["prompt_tokens"] == len(TOK.encode("Hello there, emulator."))
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # completions: no created_cache_tokens


def test_streamed_chat_equals_whole_answer(client: TestClient) -> None:
    req = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 12, "ignore_eos": True}
    whole = client.post("/v1/chat/completions", json=req).json()
    r = client.post("/v1/chat/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert isinstance(usage, dict) and usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    chunks = [e for e in events[:-2] if isinstance(e, dict)]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_second_turn_hits_the_prefix_cache(client: TestClient) -> None:
    """Turn 2 repeats turn 1's prompt + answer: all their full blocks are cached hits."""
    prompt = "You are a helpful agent. " + "Tool output: alpha beta gamma delta. " * 30
    first = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 37, "ignore_eos": True}).json()
    hits_before = metric(client.get("/metrics").text, "vllm:prefix_cache_hits_total")
    p1, o1 = first["usage"]["prompt_tokens"], first["usage"]["completion_tokens"]
    turn2 = prompt + first["choices"][0]["text"] + "\nObservation: done. Next step?"
    second = client.post("/v1/completions", json={"prompt": turn2, "max_tokens": 5, "ignore_eos": True}).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # The last sampled token's KV is never computed (as in vLLM), so the bound is on p1 + o1 - 1;
    # here p1 + o1 is not a multiple of 16, so that is all full blocks of prompt + answer.
    assert (p1 + o1) % 16 != 0
    assert cached >= (p1 + o1) // 16 * 16
    assert cached > p1
    hits_after = metric(client.get("/metrics").text, "vllm:prefix_cache_hits_total")
    assert hits_after - hits_before == cached


def test_metrics_have_vllm_names_and_model_label(client: TestClient) -> None:
    client.post("/v1/completions", json={"prompt": "count me", "max_tokens": 4, "ignore_eos": True})
    text = client.get("/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket"):
        assert f'{name}{{' in text, name
    assert 'model_name="llama-3.1-8b"' in text
    assert metric(text, "vllm:generation_tokens_total") == 4
    assert metric(text, "vllm:time_to_first_token_seconds_count") == 1
    assert metric(text, "vllm:inter_token_latency_seconds_count") == 3


BAD = [
    ("invalid json", b"{not json", 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("unknown model", {"model": "gpt-9", "prompt": "x"}, 404, "model"),
    ("negative max_tokens", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ("zero max_tokens", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens not an int", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ("over the context window", {"prompt": "x", "max_tokens": 140000}, 400, "max_tokens"),
    ("missing prompt", {"max_tokens": 3}, 400, "prompt"),
    ("empty prompt", {"prompt": "", "max_tokens": 3}, 400, "prompt"),
    ("n > 1", {"prompt": "x", "n": 2}, 400, "n"),
    ("logprobs", {"prompt": "x", "logprobs": 1}, 400, "logprobs"),
    ("echo", {"prompt": "x", "echo": True}, 400, "echo"),
    ("stream_options without stream", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, None),
    ("min_tokens > max_tokens", {"prompt": "x", "max_tokens": 2, "min_tokens": 5}, 400, None),
    ("PD without remote fields", {"prompt": "x", "kv_transfer_params": {"do_remote_prefill": True}}, 400,
     "kv_transfer_params"),
]


@pytest.mark.parametrize(("case", "payload", "status", "param"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_openai_error_and_server_keeps_serving(
    client: TestClient, case: str, payload: object, status: int, param: str | None
) -> None:
    if isinstance(payload, bytes):
        r = client.post("/v1/completions", content=payload, headers={"content-type": "application/json"})
    else:
        r = client.post("/v1/completions", json=payload)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"]
    assert err["param"] == param
    ok = client.post("/v1/completions", json={"prompt": "still there?", "max_tokens": 2})
    assert ok.status_code == 200


def test_default_window_is_the_models_own_so_a_long_agent_turn_runs(client: TestClient) -> None:
    """Llama-3.1-8B's window is 131,072 tokens (its config.json), as vLLM serves it by default;
    a 40,000-token GAIA-like turn (over the old 32,768 default) is served, not refused."""
    models = client.get("/v1/models").json()["data"]
    assert models[0]["max_model_len"] == 131_072
    prompt = " ".join(["word"] * 40_000)
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 40_000
    # Past the model's own window the prompt is refused, as vLLM 0.32 refuses it.
    full = " ".join(["word"] * 131_072)
    over = client.post("/v1/completions", json={"prompt": full, "max_tokens": 2})
    assert over.status_code == 400 and over.json()["error"]["param"] == "input_tokens"


def test_bad_chat_messages_and_unknown_fields(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages")
    r = client.post("/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400
    # vLLM ignores fields it does not know (it logs them); so does the emulator.
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 2, "frobnicate": True})
    assert r.status_code == 200
    assert client.get("/v1/nothing").json()["error"]["code"] == 404


def test_prefill_side_returns_kv_transfer_params_and_holds_kv_until_released(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "prefill me " * 40, "max_tokens": 1,
                                             "kv_transfer_params": {"do_remote_decode": True}})
    body = r.json()
    params = body["kv_transfer_params"]
    assert body["usage"]["completion_tokens"] == 1
    assert params["do_remote_prefill"] is True and params["remote_engine_id"] == "unit-0"
    assert len(params["remote_block_ids"]) == -(-body["usage"]["prompt_tokens"] // 16)
    assert metric(client.get("/metrics").text, "vllm:kv_cache_usage_perc") > 0  # pinned for the decode side
    released = client.post("/tokenomy/kv_release", json={"remote_request_id": params["remote_request_id"]})
    assert released.json() == {"released": True}
    assert metric(client.get("/metrics").text, "vllm:kv_cache_usage_perc") == 0


def test_prefill_side_frees_unpulled_kv_after_the_timeout() -> None:
    config = EmulatorConfig(time_scale=FAST, kv_release_timeout_s=5.0)  # 5 modelled s = 5 ms here
    with TestClient(build_app(config)) as c:
        r = c.post("/v1/completions", json={"prompt": "nobody pulls this " * 40, "max_tokens": 1,
                                            "kv_transfer_params": {"do_remote_decode": True}})
        assert r.json()["kv_transfer_params"]["do_remote_prefill"] is True
        for _ in range(200):  # bounded: the timer fires after about 5 ms of wall time
            if metric(c.get("/metrics").text, "vllm:kv_cache_usage_perc") == 0:
                break
        assert metric(c.get("/metrics").text, "vllm:kv_cache_usage_perc") == 0
        rid = r.json()["kv_transfer_params"]["remote_request_id"]
        assert c.post("/tokenomy/kv_release", json={"remote_request_id": rid}).json() == {"released": False}


def test_agent_chat_turn_hits_the_cache_for_the_whole_history(client: TestClient) -> None:
    msgs = [{"role": "system", "content": "You are an agent with tools. " * 20},
            {"role": "user", "content": "Find the answer."}]
    first = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 40, "ignore_eos": True}).json()
    p1, o1 = first["usage"]["prompt_tokens"], first["usage"]["completion_tokens"]
    msgs += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "tool", "content": "result: 42"}]
    second = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 5}).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= (p1 + o1 - 1) // 16 * 16


def test_event_trace_in_modelled_seconds(tmp_path: Path) -> None:
    trace = tmp_path / "events.jsonl"
    config = EmulatorConfig(time_scale=FAST, trace_events=trace)
    with TestClient(build_app(config)) as c:
        c.post("/v1/completions", json={"prompt": "trace me please", "max_tokens": 3, "ignore_eos": True})
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "queued" and "admit" in kinds and kinds.count("step") == 3 and kinds[-1] == "finish"
    steps = [e for e in events if e["kind"] == "step"]
    assert all(b["t_s"] >= a["t_s"] for a, b in zip(steps, steps[1:], strict=False))


def test_an_engine_crash_mid_stream_ends_the_stream_with_an_error_and_later_requests_get_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tokenomy.engine import Engine

    real_step, calls = Engine.step, [0]

    def step(self: Engine, now: float):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 5:
            raise RuntimeError("engine bug")
        return real_step(self, now)

    monkeypatch.setattr(Engine, "step", step)
    config = EmulatorConfig(time_scale=FAST, instance_id="unit-0", port=9)
    with TestClient(build_app(config)) as client:
        assert client.get("/health").status_code == 200
        r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 40, "ignore_eos": True,
                                                 "stream": True})
        assert r.status_code == 200  # the stream had started
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        assert isinstance(events[-2], dict) and events[-2]["error"]["code"] == 503
        texts = [e["choices"][0]["text"] for e in events[:-2] if isinstance(e, dict)]
        assert 0 < len(texts) < 40  # some tokens came before the crash, not all of them
        after = client.post("/v1/completions", json={"prompt": "anyone?", "max_tokens": 2})
        assert after.status_code == 503 and after.json()["error"]["type"] == "ServiceUnavailableError"
        assert client.get("/health").status_code == 503


def test_a_request_waiting_for_pinned_kv_runs_once_the_pin_is_released() -> None:
    # 12 blocks of 16 tokens: the pinned prefill (about 120 tokens) leaves too few for the next one.
    config = EmulatorConfig(time_scale=FAST, num_gpu_blocks=12, kv_release_timeout_s=86400.0)
    with TestClient(build_app(config)) as c:
        held = c.post("/v1/completions", json={"prompt": "pinned words " * 50, "max_tokens": 1,
                                               "kv_transfer_params": {"do_remote_decode": True}}).json()
        assert held["usage"]["prompt_tokens"] > 6 * 16
        answer: dict[str, object] = {}
        waiter = threading.Thread(target=lambda: answer.update(c.post(
            "/v1/completions", json={"prompt": "waiting words " * 50, "max_tokens": 4}).json()))
        waiter.start()
        for _ in range(500):  # bounded: until the second request is queued behind the pinned KV
            if metric(c.get("/metrics").text, "vllm:num_requests_waiting") == 1:
                break
        assert not answer
        rid = held["kv_transfer_params"]["remote_request_id"]
        assert c.post("/tokenomy/kv_release", json={"remote_request_id": rid}).json() == {"released": True}
        waiter.join(timeout=10)
        stuck = waiter.is_alive()
        if stuck:  # the engine slept until the next arrival: send one, so the app can shut down
            c.post("/v1/completions", json={"prompt": "wake", "max_tokens": 1})
            waiter.join(timeout=10)
        assert not stuck, "the released KV did not wake the idle engine"
        assert answer["usage"]["completion_tokens"] == 4  # type: ignore[index]


def test_a_prefill_with_history_tokens_pulls_that_kv_instead_of_recomputing_it(client: TestClient) -> None:
    prompt = "history words " * 60 + "then the new tool result " * 10
    plain = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                                                 "kv_transfer_params": {"do_remote_decode": True}}).json()
    n = plain["usage"]["prompt_tokens"]
    before = client.get("/metrics").text
    pulled = client.post("/v1/completions", json={"prompt": "fresh " + prompt, "max_tokens": 1, "kv_transfer_params": {
        "do_remote_decode": True, "tokenomy_history_tokens": n - 20}}).json()
    after = client.get("/metrics").text
    assert pulled["kv_transfer_params"]["do_remote_prefill"] is True
    assert metric(after, "tokenomy:kv_history_pulls_total") == metric(before, "tokenomy:kv_history_pulls_total") + 1
    assert metric(after, "tokenomy:kv_history_pull_tokens_total") == n - 20  # nothing of "fresh ..." was cached
    # Pulled KV counts as cached, as vLLM reports a KV connector's tokens; without the key, none is.
    assert pulled["usage"]["prompt_tokens_details"]["cached_tokens"] >= n - 20
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    bad = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "kv_transfer_params": {
        "do_remote_decode": True, "tokenomy_history_tokens": -1}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "kv_transfer_params"


def test_a_retention_hint_pins_a_turn_and_ttl_zero_releases_it(client: TestClient) -> None:
    assert client.post("/v1/tokenomy/retain", json={"request_id": "turn-1", "ttl_s": 86400}).json() == {"accepted": True}
    r = client.post("/v1/completions", json={"prompt": "keep my history " * 30, "max_tokens": 2},
                    headers={"x-request-id": "turn-1"})
    assert r.status_code == 200
    text = client.get("/metrics").text
    assert metric(text, "tokenomy:kv_retained_requests_total") == 1
    assert metric(text, "vllm:kv_cache_usage_perc") > 0  # pinned for the session's next turn
    client.post("/v1/tokenomy/retain", json={"request_id": "turn-1", "ttl_s": 0})
    assert metric(client.get("/metrics").text, "vllm:kv_cache_usage_perc") == 0


def test_a_decode_request_may_only_name_a_loopback_or_allowed_kv_peer(client: TestClient) -> None:
    """kv_transfer_params.remote_host comes from the request body: the emulator POSTs there after
    its KV pull, so any host would make it a proxy into the network it runs in (SSRF)."""
    params = {"do_remote_prefill": True, "remote_request_id": "x", "remote_port": 80,
              "remote_engine_id": "p", "remote_block_ids": []}
    for host in ("169.254.169.254", "internal.example", ""):
        r = client.post("/v1/completions", json={"prompt": "decode me", "max_tokens": 2,
                                                 "kv_transfer_params": {**params, "remote_host": host}})
        assert r.status_code in (400, 403) and r.json()["error"]["param"] == "kv_transfer_params", host
    config = EmulatorConfig(time_scale=FAST, instance_id="unit-1", port=9, kv_peers=("prefill.internal",))
    from tokenomy.emulator.pd import allowed_peer

    assert allowed_peer("127.0.0.1", ()) and allowed_peer("::1", ()) and allowed_peer("localhost", ())
    assert allowed_peer("prefill.internal", config.kv_peers) and not allowed_peer("10.0.0.8", config.kv_peers)


def test_a_body_over_the_limit_gets_413_and_the_server_keeps_serving() -> None:
    config = EmulatorConfig(time_scale=FAST, instance_id="unit-2", port=9, max_body_bytes=4096)
    with TestClient(build_app(config)) as c:
        r = c.post("/v1/completions", json={"prompt": "x" * 10_000, "max_tokens": 1})
        assert r.status_code == 413 and r.json()["error"]["message"].startswith("The request body is larger")
        r = c.post("/tokenomy/kv_release", content=b"{" + b" " * 8000 + b"}")
        assert r.status_code == 413
        assert c.post("/v1/completions", json={"prompt": "small", "max_tokens": 1}).status_code == 200
