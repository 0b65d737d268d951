"""``/v1/messages``, ``/v1/messages/count_tokens`` and ``/v1/responses`` in process, read by the real
anthropic and openai SDKs: answers, streams, usage, forced tool calls, a tool loop, errors."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from starlette.testclient import TestClient

MODEL = "llama-3.1-8b"  # EmulatorConfig's default served name
WEATHER = {"name": "get_weather", "description": "Weather now", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 5},
                                     "units": {"enum": ["C", "F"]}}, "required": ["city", "days"]}}
LONG_SYSTEM = "You are a careful agent. " + "Follow the house rules about tools and files. " * 20


def anthropic_sdk(client: TestClient) -> anthropic.Anthropic:
    """The anthropic SDK (it speaks httpx2) over the in-process app."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        r = client.request(request.method, request.url.path, content=request.read(),
                           headers={"content-type": "application/json"})
        return httpx2.Response(r.status_code, headers={"content-type": r.headers["content-type"]}, content=r.content)

    return anthropic.Anthropic(api_key="k", base_url="http://emulator.test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def openai_sdk(client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url="http://testserver/v1", max_retries=0, http_client=client)


def messages(client: TestClient, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello there"}], **fields}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_messages_answer_and_its_prompt_is_the_chat_prompt(client: TestClient) -> None:
    msg = messages(client, system=LONG_SYSTEM, max_tokens=6, temperature=0)
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["model"] == MODEL
    assert msg["stop_reason"] in ("max_tokens", "end_turn") and [b["type"] for b in msg["content"]] == ["text"]
    chat = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 6, "messages": [
        {"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "Hello there"}]}).json()
    assert msg["content"][0]["text"] == chat["choices"][0]["message"]["content"]  # same prompt, same answer
    u = msg["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] \
        == chat["usage"]["prompt_tokens"]
    assert chat["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # it ran second: the same blocks
    count = client.post("/v1/messages/count_tokens", json={"model": MODEL, "system": LONG_SYSTEM,
                                                           "messages": [{"role": "user", "content": "Hello there"}]})
    assert count.json() == {"input_tokens": chat["usage"]["prompt_tokens"],
                            "context_management": {"original_input_tokens": chat["usage"]["prompt_tokens"]}}


def test_first_request_writes_the_cache_and_reads_nothing(client: TestClient) -> None:
    u = messages(client, system=LONG_SYSTEM + " fresh")["usage"]
    assert u["cache_read_input_tokens"] == 0 and u["cache_creation_input_tokens"] > 0
    assert u["cache_creation_input_tokens"] % 16 == 0  # whole blocks (block size 16)


def test_messages_stream_through_the_sdk_equals_the_whole_answer(client: TestClient) -> None:
    sdk = anthropic_sdk(client)
    whole = messages(client, max_tokens=7, messages=[{"role": "user", "content": "Stream me"}])
    with sdk.messages.stream(model=MODEL, max_tokens=7, messages=[{"role": "user", "content": "Stream me"}]) as s:
        texts = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(texts) == final.content[0].text == whole["content"][0]["text"]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 7
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens \
        + final.usage.cache_creation_input_tokens == whole["usage"]["input_tokens"] \
        + whole["usage"]["cache_read_input_tokens"] + whole["usage"]["cache_creation_input_tokens"]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_forced_tool_call_is_deterministic_and_fits_the_schema(client: TestClient, choice: dict[str, Any]) -> None:
    req = {"tools": [WEATHER], "tool_choice": choice, "max_tokens": 64,
           "messages": [{"role": "user", "content": "Weather in two places?"}]}
    first, again = messages(client, **req), messages(client, **req)
    (block,) = first["content"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather" and first["stop_reason"] == "tool_use"
    assert set(block["input"]) == {"city", "days"} and isinstance(block["input"]["city"], str)
    assert 1 <= block["input"]["days"] <= 5
    assert again["content"][0]["input"] == block["input"] and again["content"][0]["id"] != block["id"]
    sdk = anthropic_sdk(client)
    with sdk.messages.stream(model=MODEL, **req) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    assert final.content[0].input == block["input"] and final.stop_reason == "tool_use"


def test_a_tool_call_cut_by_max_tokens_is_not_a_tool_use(client: TestClient) -> None:
    msg = messages(client, tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=1)
    assert msg["stop_reason"] == "max_tokens" and msg["content"][0]["input"] == {}


def test_auto_tool_choice_answers_in_text(client: TestClient) -> None:
    msg = messages(client, tools=[WEATHER])
    assert [b["type"] for b in msg["content"]] == ["text"] and msg["stop_reason"] == "max_tokens"


def test_tool_loop_second_turn_hits_the_first_turns_blocks(client: TestClient) -> None:
    turn1 = [{"role": "user", "content": "Plan the trip. " * 20}]
    a1 = messages(client, system=LONG_SYSTEM, tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=64,
                  messages=turn1)
    turn2 = [*turn1, {"role": "assistant", "content": a1["content"]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": a1["content"][0]["id"],
                                           "content": "sunny, 21C"}]}]
    a2 = messages(client, system=LONG_SYSTEM, tools=[WEATHER], max_tokens=4, messages=turn2)
    u1, u2 = a1["usage"], a2["usage"]
    prompt1 = u1["input_tokens"] + u1["cache_read_input_tokens"] + u1["cache_creation_input_tokens"]
    assert u2["cache_read_input_tokens"] >= (prompt1 + u1["output_tokens"] - 1) // 16 * 16 - 16
    assert u2["input_tokens"] < 16 + 8  # only the tool result and the tail block are new


def test_chat_forced_tool_calls_whole_and_streamed(client: TestClient) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"]}}
    base = {"model": MODEL, "max_tokens": 64, "tools": [tool], "messages": [{"role": "user", "content": "Weather?"}]}
    required = client.post("/v1/chat/completions", json={**base, "tool_choice": "required"}).json()["choices"][0]
    named = client.post("/v1/chat/completions", json={**base, "tool_choice": {
        "type": "function", "function": {"name": "get_weather"}}}).json()["choices"][0]
    assert required["finish_reason"] == "tool_calls" and named["finish_reason"] == "stop"  # vLLM's rule
    (call,) = required["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and set(json.loads(call["function"]["arguments"])) == {"city", "days"}
    r = client.post("/v1/chat/completions", json={**base, "tool_choice": "required", "stream": True,
                                                  "stream_options": {"include_usage": True}})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    deltas = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas[0]["id"].startswith("chatcmpl-tool-") and deltas[0]["function"]["name"] == "get_weather"
    assert "".join(d["function"]["arguments"] for d in deltas) == call["function"]["arguments"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_continuous_usage_stats(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 5, "ignore_eos": True, "stream": True, "messages": [{"role": "user", "content": "x"}],
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert all("usage" in c for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == 5
    assert "prompt_tokens_details" in chunks[-1]["usage"] and chunks[-1]["choices"] == []


def test_responses_whole_and_streamed_through_the_sdk(client: TestClient) -> None:
    sdk = openai_sdk(client)
    whole = sdk.responses.create(model=MODEL, input="Tell me", instructions="Be brief.", max_output_tokens=6)
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.usage is not None and whole.usage.output_tokens == 6 and whole.instructions == "Be brief."
    with sdk.responses.stream(model=MODEL, input="Tell me", instructions="Be brief.", max_output_tokens=6) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.usage is not None and final.usage.input_tokens == whole.usage.input_tokens


def test_responses_forced_function_call_and_tool_output_turn(client: TestClient) -> None:
    sdk = openai_sdk(client)
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["input_schema"], "strict": False}
    first = sdk.responses.create(model=MODEL, input="Weather?", tools=[tool], tool_choice="required",  # type: ignore[list-item]
                                 max_output_tokens=64)
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city", "days"}
    with sdk.responses.stream(model=MODEL, input="Weather?", tools=[tool], tool_choice="required",  # type: ignore[list-item]
                              max_output_tokens=64) as s:
        streamed = s.get_final_response()
    assert [o.type for o in streamed.output] == ["function_call"]
    assert streamed.output[0].arguments == call.arguments  # type: ignore[union-attr]
    second = sdk.responses.create(model=MODEL, tools=[tool], max_output_tokens=3, input=[  # type: ignore[list-item]
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text and second.usage is not None and second.usage.input_tokens > first.usage.input_tokens  # type: ignore[union-attr]


@pytest.mark.parametrize(("path", "body", "status", "shape", "param"), [
    ("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, 400, "openai", "max_tokens"),
    ("/v1/messages", {"max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}, 400, "openai", "model"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 3, "messages": "x"}, 400, "openai", "messages"),
    ("/v1/messages", {"model": "nope", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}, 404,
     "anthropic", None),
    ("/v1/messages", {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "x " * 140000}]},
     400, "anthropic", None),
    ("/v1/messages/count_tokens", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404,
     "anthropic", None),
    ("/v1/responses", {"model": MODEL, "input": 3}, 400, "openai", "input"),
    ("/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": "resp_1"}, 404, "openai",
     "previous_response_id"),
    ("/v1/responses", {"model": MODEL, "input": "x", "tool_choice": "required"}, 400, "openai", "tool_choice"),
    ("/v1/responses", {"model": MODEL, "input": "x " * 140000}, 400, "openai", "input"),
], ids=["no-max-tokens", "no-model", "messages-not-list", "unknown-model", "over-context", "count-unknown-model",
        "responses-bad-input", "previous-response", "required-without-tools", "responses-over-context"])
def test_errors_in_each_protocols_shape(client: TestClient, path: str, body: dict[str, Any], status: int,
                                        shape: str, param: str | None) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    data = r.json()
    if shape == "anthropic":
        assert data["type"] == "error" and set(data["error"]) == {"type", "message"} and data["error"]["message"]
    else:
        assert set(data["error"]) >= {"message", "type", "param", "code"} and data["error"]["code"] == status
        assert data["error"]["param"] == param


def test_bad_json_is_a_400_on_both_routes(client: TestClient) -> None:
    for path in ("/v1/messages", "/v1/responses", "/v1/messages/count_tokens"):
        r = client.post(path, content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == 400


def _crashing_app(monkeypatch: pytest.MonkeyPatch) -> TestClient:
    """An emulator whose engine raises on its fifth step (mid-stream for a 40-token answer)."""
    from tokenomy.emulator import EmulatorConfig, build_app
    from tokenomy.engine import Engine

    real_step, calls = Engine.step, [0]

    def step(self: Engine, now: float):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 5:
            raise RuntimeError("engine bug")
        return real_step(self, now)

    monkeypatch.setattr(Engine, "step", step)
    return TestClient(build_app(EmulatorConfig(time_scale=0.001, instance_id="unit-0", port=9)))


def test_an_engine_crash_mid_stream_raises_in_the_anthropic_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    with _crashing_app(monkeypatch) as client:
        sdk = anthropic_sdk(client)
        texts: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as err, sdk.messages.stream(
                model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "hello"}]) as s:
            texts.extend(s.text_stream)
        assert err.value.body["error"]["type"] == "internal_error"  # type: ignore[index]
        assert "".join(texts)  # tokens before the crash arrived first


def test_an_engine_crash_mid_stream_raises_in_the_openai_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    with _crashing_app(monkeypatch) as client:
        sdk = openai_sdk(client)
        with pytest.raises(openai.APIError) as err, sdk.responses.stream(
                model=MODEL, input="hello", max_output_tokens=40) as s:
            s.get_final_response()
        assert "engine" in err.value.message.lower()


def test_count_tokens_refuses_a_body_over_the_limit() -> None:
    from tokenomy.emulator import EmulatorConfig, build_app

    config = EmulatorConfig(time_scale=0.001, instance_id="unit-0", port=9, max_body_bytes=1024)
    with TestClient(build_app(config)) as client:
        r = client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": [
            {"role": "user", "content": "x" * 2000}]})
        assert r.status_code == 413 and r.json()["type"] == "error"
