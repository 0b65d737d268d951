"""``POST /tokenize`` and ``/detokenize`` in vLLM's shapes: counts equal what generation counts."""

from __future__ import annotations

from starlette.testclient import TestClient


def test_tokenize_counts_what_a_completion_counts(client: TestClient) -> None:
    prompt = "Hello there, emulator. The tool said: alpha beta gamma."
    tok = client.post("/tokenize", json={"prompt": prompt, "model": "llama-3.1-8b"})
    assert tok.status_code == 200
    body = tok.json()
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["count"] == len(body["tokens"]) and body["token_strs"] is None
    usage = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()["usage"]
    assert body["count"] == usage["prompt_tokens"]
    models = client.get("/v1/models").json()["data"][0]
    assert body["max_model_len"] == models["max_model_len"]


def test_tokenize_messages_counts_the_chat_template(client: TestClient) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is in the box?"}]
    tok = client.post("/tokenize", json={"messages": messages}).json()
    usage = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()["usage"]
    assert tok["count"] == usage["prompt_tokens"]
    bare = client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    # (the built-in tokenizer glues the generation prompt to the last message's end marker)
    assert bare["tokens"][:-1] == tok["tokens"][:-1] and bare["tokens"][-1] != tok["tokens"][-1]


def test_detokenize_inverts_generated_ids(client: TestClient) -> None:
    answer = client.post("/v1/completions", json={"prompt": "Go", "max_tokens": 6, "ignore_eos": True}).json()
    text = answer["choices"][0]["text"]
    ids = client.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    assert "".join(ids["token_strs"]) == text
    assert client.post("/detokenize", json={"tokens": ids["tokens"]}).json() == {"prompt": text}


def test_bad_tokenize_requests_are_openai_errors(client: TestClient) -> None:
    cases = [
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ]
    for path, body, status, param in cases:
        r = client.post(path, json=body)
        assert r.status_code == status, (path, body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and err["code"] == status and err["message"]
    r = client.post("/tokenize", content=b"{not json")
    assert r.status_code == 400 and "Invalid JSON" in r.json()["error"]["message"]
