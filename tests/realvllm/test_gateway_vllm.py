"""The gateway in front of real vLLM: metering against vLLM's own counters, P/D over NIXL, live AMPD.

All through ``tokenomy serve`` (``python -m tokenomy.gateway``) on the shared instances of
conftest.py: ``decode-1`` as a mixed backend; ``prefill-0`` -> ``decode-0`` as a P/D pair; AMPD
with ``prefill-0`` and both decode instances. Every number is read from vLLM's ``/metrics``
before and after, never assumed.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from realvllm_support import MODEL, gateway, gateway_tokens, moved, scrape, scrape_after

pytestmark = pytest.mark.integration

PROMPT = "vllm:prompt_tokens_total"
GENERATED = "vllm:generation_tokens_total"
CACHED = "vllm:prompt_tokens_cached_total"
COMPUTED_SUM = "vllm:request_prefill_kv_computed_tokens_sum"
COUNTERS = (PROMPT, GENERATED, CACHED, COMPUTED_SUM)
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"  # tokens a KV connector delivered
SYSTEM = "You are a careful travel agent. You answer with the cheapest fare and its rules. " * 12


def test_five_turn_openai_session_ledger_equals_vllm_counters(vllm_urls: dict[str, str], tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    backend = vllm_urls["decode-1"]
    with gateway(tmp_path, [{"id": "decode-1", "url": backend, "role": "mixed"}]) as (url, key):
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, default_headers={"x-session-id": "trip-1"},
                               max_retries=0, timeout=60)
        before = scrape(backend)
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        usages = []
        for turn in range(5):
            messages.append({"role": "user", "content": f"Turn {turn}: find a fare to city number {turn}."})
            r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,  # type: ignore[arg-type]
                                               extra_body={"ignore_eos": True})
            usages.append(r.usage)
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        after = scrape_after({"b": backend}, {"b": before}, 5 * 12, on=("b",))["b"]
        engine = moved(before, after, *COUNTERS)
        ledger = gateway_tokens(url)
    prompt = sum(u.prompt_tokens for u in usages)
    assert ledger["input"] + ledger.get("incremental_prefill", 0) + ledger["history"] == prompt == engine[PROMPT]
    assert ledger["output"] == 5 * 12 == engine[GENERATED]
    assert ledger["cached"] == engine[CACHED] > 0  # later turns hit vLLM's prefix cache
    assert ledger["recomputed"] == prompt - ledger["cached"] == engine[COMPUTED_SUM]


def _completion(url: str, prompt: str, headers: dict[str, str] | None = None, max_tokens: int = 16) -> dict[str, Any]:
    """Seeded sampling (the same logits give the same tokens), token ids returned.
    Not ``logprobs``: vLLM CPU 0.32 with a KV connector hangs on them (docs/vllm.md)."""
    r = httpx.post(url + "/v1/completions", headers=headers or {}, timeout=120, json={
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0,
        "seed": 7, "return_token_ids": True})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _nixl_handshake(folder: Path, backends: list[dict[str, str]], attempts: int = 3) -> None:
    """One short P/D request through its own gateway (its own ledger), until one succeeds: the decode
    side's first request to a prefill instance makes the NIXL handshake, whose reply vLLM 0.32 waits
    for 5 s at most (a constant in its NIXL worker); on a loaded 2-core machine that first request can
    fail with a 500 (``handshake_failed``) and the next one succeeds."""
    folder.mkdir()
    with gateway(folder, backends, {"mode": "disagg"}) as (url, key):
        for _ in range(attempts):
            r = httpx.post(url + "/v1/completions", headers={"authorization": f"Bearer {key}"}, timeout=120,
                           json={"model": MODEL, "prompt": f"Handshake {uuid.uuid4().hex}.", "max_tokens": 2})
            if r.status_code == 200:
                return
    raise AssertionError(f"no P/D request succeeded in {attempts} attempts: {r.status_code} {r.text}")


def test_pd_through_nixl_generates_what_a_mixed_instance_does(vllm_urls: dict[str, str], tmp_path: Path) -> None:
    # a prompt no instance has seen (instances are shared): "Run <hex>." then a fare table
    prompt = f"Run {uuid.uuid4().hex}. " + "The fare table lists every route with its price and its rules. " * 40
    mixed = _completion(vllm_urls["decode-1"], prompt)  # colocated: no kv_transfer_params
    _completion(vllm_urls["prefill-0"], prompt[: len(prompt) // 2], max_tokens=1)  # warms the prefill side's cache
    pair = {"prefill-0": vllm_urls["prefill-0"], "decode-0": vllm_urls["decode-0"]}
    backends = [{"id": i, "url": u, "role": i.split("-")[0]} for i, u in pair.items()]
    _nixl_handshake(tmp_path / "handshake", backends)
    with gateway(tmp_path, backends, {"mode": "disagg"}) as (url, key):
        before = {i: scrape(u) for i, u in pair.items()}
        pd = _completion(url, prompt, {"authorization": f"Bearer {key}"})
        after = scrape_after(pair, before, 16, on=("decode-0",))
        ledger = gateway_tokens(url)
    p, d = (moved(before[i], after[i], *COUNTERS, EXTERNAL_HITS) for i in ("prefill-0", "decode-0"))
    n = pd["usage"]["prompt_tokens"]
    assert len(pd["choices"][0]["token_ids"]) == 16
    assert pd["choices"][0]["token_ids"] == mixed["choices"][0]["token_ids"]  # sampled from the same logits
    assert p[PROMPT] == n and p[GENERATED] == 1  # the prefill side: the whole prompt, one token
    assert d[PROMPT] == n and d[GENERATED] == 16
    assert d[EXTERNAL_HITS] >= n - 128  # the decode side got the prompt's KV over NIXL (128-token blocks)
    # Metering under P/D: the cached/recomputed split is the prefill side's (here it hit its cache for
    # half the prompt). vLLM's decode side reports that count too (it arrives in kv_transfer_params),
    # not the tokens NIXL moved, though its own prompt_tokens_cached_total counts those.
    assert pd["usage"]["prompt_tokens_details"]["cached_tokens"] == p[CACHED] > 0
    assert d[CACHED] == n
    assert ledger["cached"] == p[CACHED] and ledger["recomputed"] == n - p[CACHED] == p[COMPUTED_SUM]
    assert ledger["input"] == n and ledger["output"] == 16


def test_live_ampd_session_stays_on_its_decode_instance(vllm_urls: dict[str, str], tmp_path: Path) -> None:
    backends = [{"id": i, "url": u, "role": i.split("-")[0]} for i, u in sorted(vllm_urls.items())]
    # TPOT bound 30 ms on the modelled H100: a ~2,000-token increment is placed remotely, a few words locally.
    routing = {"mode": "ampd", "slo": {"ttft_s": 2.0, "tpot_s": 0.03}}
    tool_results = ["ok", "fare table: " + "LIS 120 EUR, OPO 95 EUR, FAO 80 EUR; " * 110, "booked", "paid"]
    per_turn = []
    with gateway(tmp_path, backends, routing, log_level="debug") as (url, key):
        messages = [{"role": "system", "content": f"Session {uuid.uuid4().hex}. " + SYSTEM},
                    {"role": "user", "content": "Find the cheapest flight to Lisbon and book it."}]
        with httpx.Client(base_url=url, timeout=120,
                          headers={"authorization": f"Bearer {key}", "x-session-id": "ampd-1"}) as http:
            for turn in range(5):
                before = {i: scrape(u) for i, u in vllm_urls.items()}
                r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 8,
                                                            "ignore_eos": True, "temperature": 0})
                assert r.status_code == 200, r.text
                # the turn's 8 tokens are decoded somewhere (the prefill side answered before they began)
                after = scrape_after(vllm_urls, before, 8, on=("decode-0", "decode-1"))
                per_turn.append({i: moved(before[i], after[i], *COUNTERS, EXTERNAL_HITS) for i in vllm_urls})
                messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                if turn < 4:
                    messages.append({"role": "user", "content": f"Tool result: {tool_results[turn]}"})
    decoded_on = [{i for i, d in t.items() if i.startswith("decode") and d[GENERATED] == 8} for t in per_turn]
    bound = decoded_on[0]
    assert len(bound) == 1 and all(d == bound for d in decoded_on), per_turn  # every turn on one instance
    (decode,) = bound
    other = "decode-1" if decode == "decode-0" else "decode-0"
    assert all(t[other][PROMPT] == 0 for t in per_turn)  # the other decode instance never saw the session
    remote = [t["prefill-0"][PROMPT] > 0 for t in per_turn]
    # turn 0 (a first turn) and turn 2 (a ~2k-token tool result) prefill remotely; the one-word tool
    # results prefill locally on the bound decode instance
    assert remote == [True, False, True, False, False], per_turn
    for t, is_remote in zip(per_turn, remote, strict=True):
        if is_remote:  # one prefill token there, and the decode side got KV over NIXL
            assert t["prefill-0"][GENERATED] == 1 and t[decode][EXTERNAL_HITS] > 0, per_turn
        else:  # computed on the decode instance, nothing received
            assert t[decode][EXTERNAL_HITS] == 0 and t[decode][COMPUTED_SUM] > 0, per_turn


def _agent_turns(turn: int) -> tuple[dict[str, Any], dict[str, Any], str]:
    """An agent's tool call of ``turn`` and its result, as Messages blocks (call, result) and a result text."""
    call = {"type": "tool_use", "id": f"toolu_{turn}", "name": "fares", "input": {"city": f"city {turn}"}}
    result = {"type": "tool_result", "tool_use_id": f"toolu_{turn}", "content": f"fare {100 + turn} EUR"}
    return call, result, f"fare {100 + turn} EUR"


def test_agent_protocols_through_the_gateway_ledger_equals_vllm_counters(vllm_urls: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """Anthropic Messages (create and stream, tools, ``tool_use`` -> ``tool_result``, ``cache_control``,
    ``count_tokens``) and OpenAI Responses (create and stream, ``function_call`` items) passed through
    to vLLM's own endpoints: each turn one ledger row of the client's session, the ledger's classes
    equal to what vLLM's counters moved. The agent's tool calls are in the history it sends (vLLM
    generates calls only when started with ``--tool-call-parser``, and a random model's calls would
    not parse; the emulator tests generate them)."""
    anthropic = pytest.importorskip("anthropic")
    openai = pytest.importorskip("openai")
    backend = vllm_urls["decode-1"]
    tools = [{"name": "fares", "description": "Fares to a city.",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    with gateway(tmp_path, [{"id": "decode-1", "url": backend, "role": "mixed"}]) as (url, key):
        before = scrape(backend)
        claude = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=120,
                                     default_headers={"X-Claude-Code-Session-Id": "cc-vllm"})
        system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the cheapest fare."}]
        for turn in range(5):
            kwargs: dict[str, Any] = {"model": MODEL, "system": system, "tools": tools, "messages": messages,
                                      "max_tokens": 8, "extra_body": {"temperature": 0},
                                      "tool_choice": {"type": "none"}}
            if turn % 2:
                with claude.messages.stream(**kwargs) as stream:
                    "".join(stream.text_stream)
                    msg = stream.get_final_message()
            else:
                msg = claude.messages.create(**kwargs)
            assert msg.usage.output_tokens > 0
            call, result, _ = _agent_turns(turn)
            messages += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
        counted = claude.messages.count_tokens(model=MODEL, system=system, messages=messages)
        assert counted.input_tokens > 100
        oa = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120,
                           default_headers={"session-id": "codex-vllm"})
        items: list[dict[str, Any]] = [{"role": "user", "content": "Find the cheapest fare."}]
        functions = [{"type": "function", "name": "fares", "parameters": tools[0]["input_schema"]}]
        for turn in range(5):
            kw: dict[str, Any] = {"model": MODEL, "input": items, "tools": functions, "max_output_tokens": 8,
                                  "store": False, "tool_choice": "none", "extra_body": {"temperature": 0}}
            if turn % 2:
                with oa.responses.stream(**kw) as rs:
                    for _ in rs:
                        pass
                    resp = rs.get_final_response()
            else:
                resp = oa.responses.create(**kw)
            assert resp.usage is not None and resp.usage.output_tokens > 0
            _, _, text = _agent_turns(turn)
            items += [{"type": "function_call", "call_id": f"call_{turn}", "name": "fares",
                       "arguments": f'{{"city": "city {turn}"}}'},
                      {"type": "function_call_output", "call_id": f"call_{turn}", "output": text}]
        ledger = gateway_tokens(url)  # final once each answer ended (the ledger is written before)
        engine = moved(before, scrape_after({"b": backend}, {"b": before}, ledger["output"], on=("b",))["b"], *COUNTERS)
    import sqlite3

    with sqlite3.connect(tmp_path / "ledger.db") as db:
        rows = db.execute("SELECT session_id, endpoint, count(*) FROM usage_events GROUP BY 1, 2 ORDER BY 1").fetchall()
    assert rows == [("cc-vllm", "messages", 5), ("codex-vllm", "responses", 5)]
    prompt = ledger["input"] + ledger.get("incremental_prefill", 0) + ledger["history"]
    assert prompt == engine[PROMPT]
    assert ledger["output"] == engine[GENERATED]
    assert ledger.get("cached", 0) == engine[CACHED] > 0
    assert ledger["recomputed"] == prompt - ledger.get("cached", 0) == engine[COMPUTED_SUM]
