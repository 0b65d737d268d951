"""`--api messages|responses`: agent sessions replayed in each protocol against a backend that serves
/v1/messages and /v1/responses natively (:class:`helpers.agent_upstream.AgentUpstream`, on loopback)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from helpers.agent_upstream import AgentUpstream
from helpers.gateway_core_support import serve
from tokenomy.bench import BenchReport, run_bench
from tokenomy.cli.main import main
from tokenomy.workload import write_sessions

from .factories import agent_sessions, config

TURNS, OUT = 3, 8


def _run(api: str, upstream: AgentUpstream, **overrides: Any) -> BenchReport:
    sessions = agent_sessions(2, turns=TURNS, out=OUT, think_s=0.0, gap_s=0.0)
    with serve(upstream.app()) as url:
        return run_bench(sessions, config(targets=(url,), api=api, api_key="sk-test", **overrides))


def _by_session(upstream: AgentUpstream, api: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for body in upstream.bodies:
        sid = (json.loads(body["metadata"]["user_id"])["session_id"] if api == "messages"
               else body["prompt_cache_key"])
        out[sid].append(body)
    return out


def _assert_counts_match(rep: BenchReport, prompt: int, output: int, cached: int) -> None:
    s = rep.summary
    assert s.requests == s.finished == 2 * TURNS and rep.errors_by_status == {}
    assert rep.extras["usage_missing"] == 0
    assert [r.output_tokens for r in rep.records] == [OUT] * (2 * TURNS)
    assert sum(r.prompt_tokens for r in rep.records) == prompt
    assert sum(r.output_tokens for r in rep.records) == output
    assert sum(r.usage.cache_hit_tokens for r in rep.records) == cached > 0
    assert s.ttft_p50_s is not None and s.ttft_p50_s > 0 and s.itl_p50_s is not None
    for r in rep.records:
        r.usage.check()


def test_messages_replay_sends_tool_use_and_tool_result_blocks_and_counts_the_upstreams_tokens() -> None:
    upstream = AgentUpstream()
    rep = _run("messages", upstream)
    _assert_counts_match(rep, upstream.counted["prompt"], upstream.counted["output"], upstream.counted["cached"])
    assert all(h["x-api-key"] == "sk-test" and h["anthropic-version"] == "2023-06-01" for h in upstream.headers)
    sessions = _by_session(upstream, "messages")
    assert sorted(sessions) == ["s0", "s1"]
    for bodies in sessions.values():
        assert [len(b["messages"]) for b in bodies] == [1, 3, 5]
        for k, body in enumerate(bodies):
            assert body["stream"] is True and body["max_tokens"] == OUT and body["ignore_eos"] is True
            assert body["system"][0]["cache_control"] == {"type": "ephemeral"} and len(body["system"]) == 1
            if k == 0:
                continue
            prev = bodies[k - 1]
            assert body["messages"][: len(prev["messages"])] == prev["messages"]  # history re-sent byte for byte
            asst, result = body["messages"][-2:]
            text, call = asst["content"]
            assert text == {"type": "text", "text": " ".join(f"w{i}" for i in range(OUT))}  # the answer it streamed
            assert call == {"type": "tool_use", "id": f"toolu_{k}", "name": "tool", "input": {}}
            (block,) = result["content"]
            assert block["type"] == "tool_result" and block["tool_use_id"] == f"toolu_{k}" and block["content"]
    for body, headers in zip(upstream.bodies, upstream.headers, strict=True):  # the session id, as agents send it
        assert json.loads(body["metadata"]["user_id"]) == {"session_id": headers["x-session-id"]}


def test_responses_replay_sends_function_calls_and_their_outputs_and_counts_the_upstreams_tokens() -> None:
    upstream = AgentUpstream()
    rep = _run("responses", upstream)
    _assert_counts_match(rep, upstream.counted["prompt"], upstream.counted["output"], upstream.counted["cached"])
    assert all(h["authorization"] == "Bearer sk-test" for h in upstream.headers)
    for bodies in _by_session(upstream, "responses").values():
        assert [len(b["input"]) for b in bodies] == [1, 4, 7]
        for k, body in enumerate(bodies):
            assert body["stream"] is True and body["store"] is False and body["max_output_tokens"] == OUT
            assert body["instructions"] and body["ignore_eos"] is True
            if k == 0:
                assert body["input"][0]["type"] == "message" and body["input"][0]["role"] == "user"
                continue
            prev = bodies[k - 1]
            assert body["input"][: len(prev["input"])] == prev["input"]
            answer, call, output = body["input"][-3:]
            assert answer == {"type": "message", "role": "assistant", "content": " ".join(f"w{i}" for i in range(OUT))}
            assert call == {"type": "function_call", "call_id": f"call_{k}", "name": "tool", "arguments": "{}"}
            assert output["type"] == "function_call_output" and output["call_id"] == f"call_{k}" and output["output"]


def test_chat_replay_is_unchanged_and_counts_the_upstreams_tokens() -> None:
    upstream = AgentUpstream()
    rep = _run("chat", upstream)
    usages = upstream.chat.usages
    _assert_counts_match(rep, sum(u["prompt_tokens"] for u in usages), sum(u["completion_tokens"] for u in usages),
                         sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages))
    assert {tuple(m["role"] for m in b["messages"]) for b in upstream.chat.bodies} >= {
        ("system", "user", "assistant", "user", "assistant", "user")}


def test_without_tool_calls_answers_and_new_input_are_plain_messages() -> None:
    upstream = AgentUpstream()
    _run("messages", upstream, tool_calls=False)
    last = max(upstream.bodies, key=lambda b: len(b["messages"]))
    assert [m["role"] for m in last["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert {blk["type"] for m in last["messages"] for blk in m["content"]} == {"text"}


@pytest.mark.integration
def test_cli_api_responses_end_to_end(tmp_path: Path) -> None:
    out, trace = tmp_path / "b.json", tmp_path / "w.jsonl"
    write_sessions(trace, agent_sessions(2, turns=2, think_s=0.0, gap_s=0.0))
    upstream = AgentUpstream()
    with serve(upstream.app()) as url:
        rc = main(["bench", "--target", url, "--model", "m", "--workload", str(trace), "--api", "responses",
                   "--tokenizer", "none", "--json", str(out), "--quiet"])
    assert rc == 0
    payload = json.loads(out.read_text())
    assert payload["bench"]["api"] == "responses" and payload["bench"]["tool_calls"] is True
    d = payload["deployments"]["bench"]
    assert d["requests"] == 4 and d["errors_by_status"] == {}
    assert d["tokens"]["prompt_tokens"] == upstream.counted["prompt"]
